/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

/* Pure helpers of the HTTP layer: what a header names, what a socket address is. No I/O. */

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
