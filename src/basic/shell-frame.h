/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* The framing of `vm shell` on the upgraded connection (docs/cli.md, api/openapi.yaml). A terminal
 * session needs more than bytes both ways: the client's window size changes, and the shell's exit
 * status or the reason it never ran must reach the client after the last byte of output. So each
 * direction is a sequence of frames: one byte of type, two bytes of payload length (big-endian),
 * then the payload.
 *
 *   SHELL_FRAME_DATA    either way: terminal bytes (keys in, output out), 0..SHELL_FRAME_PAYLOAD_MAX
 *   SHELL_FRAME_RESIZE  client → server: rows and columns, two big-endian 16-bit numbers, neither 0
 *   SHELL_FRAME_EXIT    server → client: the shell's exit status, a big-endian 32-bit number 0..255;
 *                       the server closes the connection after it
 *   SHELL_FRAME_ERROR   server → client: why the session could not run, text; the server closes after
 *
 * The client ends the session by closing its side of the connection. */

typedef enum ShellFrameType {
        SHELL_FRAME_DATA = 1,
        SHELL_FRAME_RESIZE = 2,
        SHELL_FRAME_EXIT = 3,
        SHELL_FRAME_ERROR = 4,
} ShellFrameType;

#define SHELL_FRAME_HEADER_SIZE 3U
/* Small enough that a frame fits a socket buffer at once, large enough for a burst of output. */
#define SHELL_FRAME_PAYLOAD_MAX ((size_t) 16384)

typedef struct ShellFrame {
        ShellFrameType type;
        const uint8_t *payload; /* borrowed: points into the parsed buffer */
        size_t size;
        uint16_t rows, cols; /* SHELL_FRAME_RESIZE */
        uint32_t status;     /* SHELL_FRAME_EXIT */
} ShellFrame;

/* Decodes the frame at the start of buf: the bytes it takes (> 0) and *ret; 0 when buf holds only a
 * part of it; -EBADMSG for an unknown type, a length over SHELL_FRAME_PAYLOAD_MAX, or a RESIZE or
 * EXIT payload that is not what its type says. */
int shell_frame_parse(const uint8_t *buf, size_t len, ShellFrame *ret);

/* Writes the header of a frame of type with size bytes of payload (size <= SHELL_FRAME_PAYLOAD_MAX). */
void shell_frame_header(uint8_t out[static SHELL_FRAME_HEADER_SIZE], ShellFrameType type, size_t size);
/* A whole RESIZE or EXIT frame: its size is returned. */
size_t shell_frame_resize(uint8_t out[static SHELL_FRAME_HEADER_SIZE + 4], uint16_t rows, uint16_t cols);
size_t shell_frame_exit(uint8_t out[static SHELL_FRAME_HEADER_SIZE + 4], uint32_t status);
