#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""vm-agent attest against a stand-in IMDS (a Python HTTP server on 127.0.0.1) and a swtpm: what it
sends, how it maps the answers to exit codes and messages (0 verified, 2 rejected, 1 anything
else), and the retry with backoff while the IMDS is not reachable, bounded by --timeout.

Skips when swtpm is missing.
"""

import http.server
import json
import re
import socket
import subprocess
import threading

import agenttest
from agenttest import b64

NONCE = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"


class Imds:
    """The IMDS's attestation endpoints below /giantswarm/v1. quote_answer is (status, content type,
    body) for POST /attest/quote; nonce_answer likewise for GET /attest/nonce, challenge_answer for
    POST /attest/challenge (by default the 409 of a vTPM without an EK certificate, after which the
    agent quotes anyway; the credential activation itself is test-attest-activate's)."""

    def __init__(self, port=0):
        self.requests = []
        self.nonce_answer = (200, "text/plain; charset=utf-8", NONCE)
        self.challenge_answer = (409, "text/plain; charset=utf-8", "credential activation is not possible: this "
                                 "vm's vTPM has no EK certificate: test")
        self.quote_answer = (200, "application/json", {"stage": "initrd", "verified": True,
                                                       "user_data_released": True, "message": "verified: ak 0123"})
        imds = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def answer(self, status, ctype, body):
                if isinstance(body, (dict, list)):
                    body = json.dumps(body)
                data = body.encode()
                self.send_response(status)
                if ctype:
                    self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                imds.requests.append(("GET", self.path, dict(self.headers), None))
                if self.path == "/giantswarm/v1/attest/nonce":
                    self.answer(*imds.nonce_answer)
                else:
                    self.answer(404, "text/plain", "404 page not found\n")

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                imds.requests.append(("POST", self.path, dict(self.headers), body))
                if self.path == "/giantswarm/v1/attest/quote":
                    self.answer(*imds.quote_answer)
                elif self.path == "/giantswarm/v1/attest/challenge":
                    self.answer(*imds.challenge_answer)
                else:
                    self.answer(404, "text/plain", "404 page not found\n")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = "http://127.0.0.1:%d/giantswarm/v1" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test(tap, workdir):
    tpm = agenttest.Swtpm(workdir)
    imds = Imds()
    try:
        run(tap, tpm, imds)
    finally:
        imds.close()
        tpm.close()


def attest(tpm, url, *extra, stage="initrd"):
    return agenttest.run_agent(["attest", "--stage=" + stage, "--imds-url=" + url, "--tpm=" + tpm.tcti,
                                "--timeout=20s"] + list(extra))


def run(tap, tpm, imds):
    version = agenttest.run_agent(["version"]).out.split()[2]

    # Verified.
    r = attest(tpm, imds.url + "/")
    tap.ok(r.rc == 0 and "attestation verified" in r.err, "a verified quote exits 0", r)
    tap.ok([(m, p) for m, p, _, _ in imds.requests] ==
           [("POST", "/giantswarm/v1/attest/challenge"), ("GET", "/giantswarm/v1/attest/nonce"),
            ("POST", "/giantswarm/v1/attest/quote")],
           "the agent asks for a credential, fetches a nonce and posts one quote (a trailing slash on --imds-url "
           "is dropped)",
           imds.requests)
    tap.ok(all(h.get("User-Agent") == "vm-agent/" + version for _, _, h, _ in imds.requests),
           "every request carries User-Agent vm-agent/<version>", [h for _, _, h, _ in imds.requests])
    _, _, headers, body = imds.requests[-1]
    req = json.loads(body)
    tap.ok(headers.get("Content-Type") == "application/json", "the quote is posted as application/json", headers)
    tap.ok(req["stage"] == "initrd" and req["nonce"] == NONCE
           and agenttest.parse_attest(b64(req["quote"]))["extra"] == bytes.fromhex(NONCE),
           "the posted quote is over the IMDS's nonce", req)
    tap.ok(set(req) == {"stage", "nonce", "ak_pub", "ek_pub", "quote", "signature", "pcrs"},
           "the posted request has the QuoteRequest fields", list(req))

    n = len(imds.requests)
    r = attest(tpm, imds.url, stage="ready")
    tap.ok(r.rc == 0 and json.loads(imds.requests[-1][3])["stage"] == "ready", "stage ready is posted as such", r)
    tap.ok([p for _, p, _, _ in imds.requests[n:]] == ["/giantswarm/v1/attest/nonce", "/giantswarm/v1/attest/quote"],
           "a ready quote is not preceded by a credential activation", imds.requests[n:])

    # The credential activation refused: the quote is not made.
    imds.challenge_answer = (403, "text/plain; charset=utf-8", "endorsement key foreign: test")
    n = len(imds.requests)
    r = attest(tpm, imds.url)
    tap.ok(r.rc == 2 and r.err.endswith("Attestation rejected: credential challenge: HTTP 403: endorsement key "
                                        "foreign: test\n") and len(imds.requests) == n + 1,
           "a refused challenge exits 2 with the daemon's text, and nothing is quoted", r)
    # A daemon from before credential activation answers 404: the quote goes ahead.
    imds.challenge_answer = (404, "text/plain", "404 page not found\n")
    r = attest(tpm, imds.url)
    tap.ok(r.rc == 0 and "no credential activation: credential challenge: HTTP 404" in r.err,
           "a 404 to the challenge (an older daemon) is logged and the quote goes ahead", r)

    # Rejected: 403 with the verdict, and 200 with verified false.
    imds.quote_answer = (403, "application/json",
                         {"stage": "initrd", "verified": False, "user_data_released": False, "message": "x"})
    r = attest(tpm, imds.url)
    tap.ok(r.rc == 2 and r.err.endswith("Attestation rejected: x\n"), "a 403 verdict exits 2 with its message", r)
    imds.quote_answer = (200, "application/json; charset=utf-8",
                         {"stage": "initrd", "verified": False, "message": "unknown or expired nonce"})
    r = attest(tpm, imds.url)
    tap.ok(r.rc == 2 and r.err.endswith("Attestation rejected: unknown or expired nonce\n"),
           "a 200 verdict with verified false exits 2", r)

    # Errors.
    imds.quote_answer = (403, None, "")
    r = attest(tpm, imds.url)
    tap.ok(r.rc == 1 and r.err.endswith("Error: post quote: HTTP 403: the IMDS does not map this address to a VM\n"),
           "an empty 403 exits 1: the IMDS does not know the address", r)
    imds.quote_answer = (403, "text/plain; charset=utf-8", "forbidden: client address is not a managed VM")
    r = attest(tpm, imds.url)
    tap.ok(r.rc == 1 and r.err.endswith("Error: post quote: HTTP 403: forbidden: client address is not a managed VM\n"),
           "a 403 that is not JSON exits 1 with its text", r)
    imds.quote_answer = (200, "text/html", "<html>a captive portal</html>\n")
    r = attest(tpm, imds.url)
    tap.ok(r.rc == 1 and r.err.endswith("Error: post quote: HTTP 200: <html>a captive portal</html>\n"),
           "a 200 that is not JSON exits 1", r)
    imds.quote_answer = (400, "text/plain; charset=utf-8", "malformed quote: " + "y" * 2000)
    r = attest(tpm, imds.url)
    m = re.search(r"Error: post quote: HTTP 400: malformed quote: (y+)\n$", r.err)
    tap.ok(r.rc == 1 and m and len("malformed quote: " + m.group(1)) == 512,
           "a 400 exits 1, its text cut at 512 bytes", r)
    imds.quote_answer = (500, "application/json", {"message": "boom"})
    r = attest(tpm, imds.url)
    tap.ok(r.rc == 1 and r.err.endswith("Error: post quote: HTTP 500: boom\n"), "a JSON 500 exits 1", r)
    imds.quote_answer = (403, "application/json", "{not json")
    r = attest(tpm, imds.url)
    tap.ok(r.rc == 1 and "Error: post quote: decode answer (HTTP 403): " in r.err, "broken JSON exits 1", r)

    imds.nonce_answer = (500, "text/plain; charset=utf-8", "attestation unavailable")
    n = len(imds.requests)
    r = attest(tpm, imds.url)
    tap.ok(r.rc == 1 and r.err.endswith("Error: fetch nonce: HTTP 500: attestation unavailable\n")
           and len(imds.requests) == n + 2, "a failed nonce fetch exits 1 and is not retried", r)
    imds.nonce_answer = (200, "text/plain", "not-a-nonce")
    r = attest(tpm, imds.url)
    tap.ok(r.rc == 1 and r.err.endswith("Error: fetch nonce: nonce is not hex\n"), "a nonce that is not hex exits 1", r)
    imds.nonce_answer = (200, "text/plain", "\n " + NONCE + "\n")
    imds.quote_answer = (200, "application/json", {"stage": "initrd", "verified": True})
    r = attest(tpm, imds.url)
    tap.ok(r.rc == 0 and json.loads(imds.requests[-1][3])["nonce"] == NONCE, "the nonce is trimmed", r)

    # --print fetches the nonce and posts nothing.
    n = len(imds.requests)
    r = attest(tpm, imds.url, "--print")
    tap.ok(r.rc == 0 and json.loads(r.out)["nonce"] == NONCE
           and [m for m, _, _, _ in imds.requests[n:]] == ["GET"], "--print fetches a nonce and posts nothing", r)

    # Not reachable: retried with backoff until the IMDS answers. It comes up after the second retry.
    port = free_port()
    p = subprocess.Popen([agenttest.AGENT, "attest", "--stage=initrd", "--tpm=" + tpm.tcti, "--timeout=20s",
                          "--imds-url=http://127.0.0.1:%d/giantswarm/v1" % port],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=agenttest.agent_env())
    err, late = "", None
    try:
        for line in p.stderr:
            err += line
            if late is None and err.count("imds not reachable, retrying") == 2:
                late = Imds(port)
        rc = p.wait(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if late:
            late.close()
    tap.ok(rc == 0 and late is not None and len(late.requests) == 3 and not agenttest.SANITIZER_RE.search(err),
           "an IMDS that comes up late is reached by the retries", "rc=%s\n%s" % (rc, err))

    # ... or until --timeout.
    r = agenttest.run_agent(["attest", "--stage=initrd", "--imds-url=http://127.0.0.1:%d/giantswarm/v1" % free_port(),
                             "--tpm=" + tpm.tcti, "--timeout=2s"])
    tap.ok(r.rc == 1 and "Error: credential challenge: imds not reachable within the timeout: " in r.err
           and 1.9 <= r.elapsed < 8, "no IMDS within --timeout=2s exits 1 after about 2 s", r)
    delays = re.findall(r"retrying in (\d+m?s)", r.err)
    tap.ok(delays[:3] == ["250ms", "500ms", "1s"], "the backoff starts at 250 ms and doubles", delays)


if __name__ == "__main__":
    agenttest.main(test)
