/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "api-error.h"

/* Pure helpers of the HTTP layer: what a header names, what a socket address is, which status an
 * error is answered with. No I/O. */

/* The status REST, MCP's transport and the metadata service answer an error with, from its stable
 * code (api-contract §3): not_found 404, invalid_request 400 (413 when the error is -EFBIG or
 * -E2BIG, a body over its limit), conflict 409, unsupported 501, timeout 504, unauthorized 401, and
 * 500 for internal_error, vm_failed and any code outside the table. */
unsigned http_status_from_error(const ApiError *e) _pure_;

/* Whether host, the value of a Host header or the authority of an Origin ("name", "name:port",
 * "[v6]" or "[v6]:port"), names this machine's loopback: "localhost" (any case), an IPv4 address in
 * 127.0.0.0/8 in dotted-quad form, or [::1] (also written out, or as ::ffff:127.x.y.z). A port, when
 * present, must be 1 to 5 digits. Anything else, the empty string included, is not loopback. */
bool http_host_is_loopback(const char *host, size_t len);

/* Whether origin ("scheme://authority", as browsers send it) has a loopback authority. "null" and
 * anything without "://" are not loopback. */
bool http_origin_is_loopback(const char *origin);

/* Whether a Content-Type value is application/json, in any case, with or without parameters
 * ("application/json; charset=utf-8"). NULL is not. */
bool http_content_type_is_json(const char *content_type);

/* Whether sa is a loopback address: 127.0.0.0/8, ::1 or ::ffff:127.0.0.0/104. */
bool http_sockaddr_is_loopback(const struct sockaddr *sa, socklen_t len);

/* The peer a connection limit counts against: the IPv4 address, or the /64 of an IPv6 address
 * (one host usually holds a whole /64), IPv4-mapped addresses counted as IPv4. Writes at most
 * HTTP_PEER_MAX bytes including the NUL; returns false for other families. */
#define HTTP_PEER_MAX 64
bool http_sockaddr_peer(const struct sockaddr *sa, socklen_t len, char ret[static HTTP_PEER_MAX]);

/* One header field of a request, as libmicrohttpd reported it: pointers into the request head. */
typedef struct HttpHeadField {
        const char *name;
        size_t name_len;
        const char *value;
        size_t value_len;
} HttpHeadField;

/* A request head as libmicrohttpd 0.9.75 leaves it in its read buffer once parsed. It splits the
 * head in place: the first space of the request line, the space before the version, every colon
 * and every line end (CRLF or a bare LF) become NUL bytes, and every string it reports ends at the
 * first NUL. A NUL the client sent therefore cuts a value short, and what followed it on the line
 * is silently dropped ("Host: 127.0.0.1\0evil.example"). */
typedef struct HttpHead {
        const char *start; /* the method, where the head begins */
        size_t size;       /* up to and including the empty line (MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE) */
        const char *target;  /* the request target when the URI callback saw it, still undecoded, or NULL */
        size_t target_len;   /* its strlen() then */
        const char *version; /* "HTTP/1.1", inside the head */
        const HttpHeadField *fields; /* the header fields in the order they arrived */
        size_t n_fields;
} HttpHead;

#define HTTP_HEAD_REQUEST_LINE SIZE_MAX

/* Whether every byte of the head is accounted for by what libmicrohttpd reported: between the
 * pieces there may be only the separators it overwrote (one NUL and spaces after the method, a
 * colon's NUL and blanks before a value, one or two NULs for a line end, two to four at the end).
 * Returns 0 when so; -EBADMSG when a line holds more than was reported, which only a NUL byte the
 * client sent produces; -EPROTO when a field does not sit where the head says it should, as a
 * folded line (obs-fold) leaves it. On failure *reterr_field is the index of the field at fault,
 * or HTTP_HEAD_REQUEST_LINE. A NUL that stands only among line end bytes ("\0\n", or "\0\r\n\n"
 * at the end of the head) reads as a line end and may pass: it hides nothing. */
int http_head_check(const HttpHead *h, size_t *reterr_field);
