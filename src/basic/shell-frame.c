/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The frames of `vm shell` (shell-frame.h). */
#include <assert.h>
#include <errno.h>

#include "shell-frame.h"

static uint16_t get_be16(const uint8_t *p) {
        return (uint16_t) ((p[0] << 8) | p[1]);
}

static uint32_t get_be32(const uint8_t *p) {
        return ((uint32_t) p[0] << 24) | ((uint32_t) p[1] << 16) | ((uint32_t) p[2] << 8) | p[3];
}

int shell_frame_parse(const uint8_t *buf, size_t len, ShellFrame *ret) {
        ShellFrame f = {};
        size_t size;

        assert(buf || len == 0);
        assert(ret);
        if (len < SHELL_FRAME_HEADER_SIZE)
                return 0;
        size = get_be16(buf + 1);
        if (size > SHELL_FRAME_PAYLOAD_MAX)
                return -EBADMSG;
        f.type = (ShellFrameType) buf[0];
        switch (f.type) {
        case SHELL_FRAME_DATA:
        case SHELL_FRAME_ERROR:
                break;
        case SHELL_FRAME_RESIZE:
        case SHELL_FRAME_EXIT:
                if (size != 4)
                        return -EBADMSG;
                break;
        default:
                return -EBADMSG;
        }
        if (len - SHELL_FRAME_HEADER_SIZE < size)
                return 0;
        f.payload = buf + SHELL_FRAME_HEADER_SIZE;
        f.size = size;
        if (f.type == SHELL_FRAME_RESIZE) {
                f.rows = get_be16(f.payload);
                f.cols = get_be16(f.payload + 2);
                /* a zero-sized terminal is no terminal: the peer is confused, not resized */
                if (f.rows == 0 || f.cols == 0)
                        return -EBADMSG;
        } else if (f.type == SHELL_FRAME_EXIT) {
                f.status = get_be32(f.payload);
                if (f.status > 255)
                        return -EBADMSG;
        }
        *ret = f;
        return (int) (SHELL_FRAME_HEADER_SIZE + size);
}

void shell_frame_header(uint8_t out[static SHELL_FRAME_HEADER_SIZE], ShellFrameType type, size_t size) {
        assert(size <= SHELL_FRAME_PAYLOAD_MAX);
        out[0] = (uint8_t) type;
        out[1] = (uint8_t) (size >> 8);
        out[2] = (uint8_t) size;
}

size_t shell_frame_resize(uint8_t out[static SHELL_FRAME_HEADER_SIZE + 4], uint16_t rows, uint16_t cols) {
        shell_frame_header(out, SHELL_FRAME_RESIZE, 4);
        out[3] = (uint8_t) (rows >> 8);
        out[4] = (uint8_t) rows;
        out[5] = (uint8_t) (cols >> 8);
        out[6] = (uint8_t) cols;
        return SHELL_FRAME_HEADER_SIZE + 4;
}

size_t shell_frame_exit(uint8_t out[static SHELL_FRAME_HEADER_SIZE + 4], uint32_t status) {
        shell_frame_header(out, SHELL_FRAME_EXIT, 4);
        out[3] = (uint8_t) (status >> 24);
        out[4] = (uint8_t) (status >> 16);
        out[5] = (uint8_t) (status >> 8);
        out[6] = (uint8_t) status;
        return SHELL_FRAME_HEADER_SIZE + 4;
}
