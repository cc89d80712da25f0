/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cleanup.h"
#include "file-writer.h"
#include "fs-util.h"
#include "test-util.h"

/* The writer against a real sd-event loop: writes of one path land in the order asked for, a
 * removal comes after the writes before it, a barrier after everything before it, and a freed
 * writer finishes what was still queued. */

typedef struct Seen {
        unsigned n;
        int r[512];
        unsigned order[512]; /* which request (its userdata index) finished n-th */
        sd_event *event;
        unsigned exit_after;
} Seen;

typedef struct Tag {
        Seen *seen;
        unsigned index;
} Tag;

static void on_done(int r, const char *path, void *userdata) {
        Tag *t = userdata;
        Seen *s = t->seen;

        assert_true(s->n < ELEMENTSOF(s->r));
        s->r[s->n] = r;
        s->order[s->n] = t->index;
        s->n++;
        if (s->event && s->n == s->exit_after)
                (void) sd_event_exit(s->event, 0);
}

static char *make_dir(void) {
        char *d = strdup("/tmp/test-file-writer-XXXXXX");

        assert_non_null(d);
        assert_non_null(mkdtemp(d));
        return d;
}

static char *join(const char *dir, const char *name) {
        char *p = NULL;

        assert_true(asprintf(&p, "%s/%s", dir, name) >= 0);
        return p;
}

/* 300 writes of one record (more than the worker takes at once), then a barrier: the file holds
 * the last, and every request finished in the order asked for. */
static void test_writes_keep_their_order(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(file_writer_freep) FileWriter *w = NULL;
        _cleanup_free_ char *dir = make_dir(), *path = join(dir, "vm.json"), *text = NULL;
        static Tag tags[301];
        static Seen seen;
        char buf[32];

        assert_ok(sd_event_new(&e));
        assert_ok(file_writer_new(e, "test-writer", &w));
        seen = (Seen){ .event = e, .exit_after = 301 };
        for (unsigned i = 0; i < 300; i++) {
                tags[i] = (Tag){ .seen = &seen, .index = i };
                snprintf(buf, sizeof(buf), "version %u\n", i);
                assert_ok(file_writer_write(w, path, buf, strlen(buf), 0600, on_done, &tags[i]));
        }
        tags[300] = (Tag){ .seen = &seen, .index = 300 };
        assert_ok(file_writer_sync(w, on_done, &tags[300]));
        assert_int_equal(file_writer_pending(w), 301);
        /* nothing was written on the loop's thread before it ran: the jobs are queued */
        assert_ok(sd_event_loop(e));

        assert_int_equal(seen.n, 301);
        for (unsigned i = 0; i < 301; i++) {
                assert_int_equal(seen.order[i], i);
                assert_int_equal(seen.r[i], 0);
        }
        assert_int_equal(file_writer_pending(w), 0);
        assert_ok(read_full_file(path, 4096, &text, NULL));
        assert_string_equal(text, "version 299\n");
        assert_int_equal(write_file_atomic_cleanup(path), 0); /* no temporary file left */
        w = file_writer_free(w);
        assert_ok(rm_rf(dir));
}

/* A JSON write is rendered on the thread as json_dumps_pretty() renders it, in order with the plain
 * writes; one over its maximum fails with EFBIG and leaves the file as it was. */
static void test_write_json(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(file_writer_freep) FileWriter *w = NULL;
        _cleanup_free_ char *dir = make_dir(), *path = join(dir, "vm.json"), *text = NULL;
        static Tag tags[3];
        static Seen seen;

        assert_ok(sd_event_new(&e));
        assert_ok(file_writer_new(e, "test-writer", &w));
        seen = (Seen){ .event = e, .exit_after = 3 };
        for (unsigned i = 0; i < 3; i++)
                tags[i] = (Tag){ .seen = &seen, .index = i };
        assert_ok(file_writer_write(w, path, "old\n", 4, 0600, on_done, &tags[0]));
        assert_ok(file_writer_write_json(
                w, path, json_pack("{s:s,s:[i]}", "id", "vm-1", "n", 1), 4096, 0600, on_done, &tags[1]));
        assert_ok(file_writer_write_json(w, path, json_string("too long for 4"), 4, 0600, on_done, &tags[2]));
        assert_ok(sd_event_loop(e));

        assert_int_equal(seen.n, 3);
        assert_int_equal(seen.r[0], 0);
        assert_int_equal(seen.r[1], 0);
        assert_int_equal(seen.r[2], -EFBIG);
        assert_ok(read_full_file(path, 4096, &text, NULL));
        assert_string_equal(text, "{\n  \"id\": \"vm-1\",\n  \"n\": [\n    1\n  ]\n}\n");
        w = file_writer_free(w);
        assert_ok(rm_rf(dir));
}

/* A removal of a directory waits for the writes into it asked for before; a copy_new keeps an
 * existing file; a write into a removed directory fails with ENOENT instead of re-creating it. */
static void test_remove_after_writes(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(file_writer_freep) FileWriter *w = NULL;
        _cleanup_free_ char *dir = make_dir(), *vmdir = join(dir, "vm"), *rec = join(vmdir, "vm.json"),
                            *src = join(dir, "vars"), *dst = join(dir, "vars.copy"), *text = NULL;
        static Tag tags[6];
        static Seen seen;
        struct stat st;

        assert_ok(sd_event_new(&e));
        assert_ok(file_writer_new(e, NULL, &w));
        assert_ok(mkdir_p(vmdir, 0700));
        assert_ok(write_file_atomic(src, "firmware", 8, 0644));
        seen = (Seen){ .event = e, .exit_after = 6 };
        for (unsigned i = 0; i < ELEMENTSOF(tags); i++)
                tags[i] = (Tag){ .seen = &seen, .index = i };

        assert_ok(file_writer_write(w, rec, "{}", 2, 0600, on_done, &tags[0]));
        assert_ok(file_writer_remove(w, vmdir, on_done, &tags[1]));
        assert_ok(file_writer_write(w, rec, "{}", 2, 0600, on_done, &tags[2]));
        assert_ok(file_writer_copy_new(w, src, dst, 1024, 0600, on_done, &tags[3]));
        assert_ok(file_writer_write(w, src, "other", 5, 0644, on_done, &tags[4]));
        assert_ok(file_writer_copy_new(w, src, dst, 1024, 0600, on_done, &tags[5]));
        assert_ok(sd_event_loop(e));

        assert_int_equal(seen.n, 6);
        assert_int_equal(seen.r[0], 0);
        assert_int_equal(seen.r[1], 0);
        assert_int_equal(seen.r[2], -ENOENT);
        assert_int_equal(seen.r[3], 0);
        assert_int_equal(seen.r[5], 0);
        assert_int_equal(stat(vmdir, &st), -1);
        assert_ok(read_full_file(dst, 1024, &text, NULL));
        assert_string_equal(text, "firmware"); /* the second copy left the first in place */
        assert_ok(stat(dst, &st));
        assert_int_equal(st.st_mode & 07777, 0600);
        w = file_writer_free(w);
        assert_ok(rm_rf(dir));
}

/* An unlink removes one file after the writes to it, is content with a file already gone, and
 * refuses a directory rather than removing a tree (a provider's directory volume is not ours). */
static void test_unlink(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_(file_writer_freep) FileWriter *w = NULL;
        _cleanup_free_ char *dir = make_dir(), *disk = join(dir, "vm-1.volume"),
                            *sub = join(dir, "vm-2.volume"), *inner = join(sub, "keep");
        static Tag tags[4];
        static Seen seen;
        struct stat st;

        assert_ok(sd_event_new(&e));
        assert_ok(file_writer_new(e, NULL, &w));
        assert_ok(mkdir_p(sub, 0700));
        assert_ok(write_file_atomic(inner, "x", 1, 0600));
        seen = (Seen){ .event = e, .exit_after = 4 };
        for (unsigned i = 0; i < ELEMENTSOF(tags); i++)
                tags[i] = (Tag){ .seen = &seen, .index = i };

        assert_ok(file_writer_write(w, disk, "disk", 4, 0600, on_done, &tags[0]));
        assert_ok(file_writer_unlink(w, disk, on_done, &tags[1]));
        assert_ok(file_writer_unlink(w, disk, on_done, &tags[2]));
        assert_ok(file_writer_unlink(w, sub, on_done, &tags[3]));
        assert_ok(sd_event_loop(e));

        assert_int_equal(seen.n, 4);
        assert_int_equal(seen.r[0], 0);
        assert_int_equal(seen.r[1], 0);
        assert_int_equal(seen.r[2], 0);
        assert_int_equal(seen.r[3], -EISDIR);
        assert_int_equal(stat(disk, &st), -1);
        assert_ok(stat(inner, &st));
        w = file_writer_free(w);
        assert_ok(rm_rf(dir));
}

/* Freed with jobs queued (the loop never ran): every one is written, in order, and done() hears. */
static void test_free_finishes_queued(void **state) {
        _cleanup_(sd_event_unrefp) sd_event *e = NULL;
        _cleanup_free_ char *dir = make_dir(), *path = join(dir, "networks.json"), *text = NULL;
        FileWriter *w = NULL;
        static Tag tags[100];
        static Seen seen;
        char buf[32];

        assert_ok(sd_event_new(&e));
        assert_ok(file_writer_new(e, NULL, &w));
        seen = (Seen){};
        for (unsigned i = 0; i < ELEMENTSOF(tags); i++) {
                tags[i] = (Tag){ .seen = &seen, .index = i };
                snprintf(buf, sizeof(buf), "%u", i);
                assert_ok(file_writer_write(w, path, buf, strlen(buf), 0600, on_done, &tags[i]));
        }
        w = file_writer_free(w);
        assert_int_equal(seen.n, ELEMENTSOF(tags));
        for (unsigned i = 0; i < ELEMENTSOF(tags); i++) {
                assert_int_equal(seen.order[i], i);
                assert_int_equal(seen.r[i], 0);
        }
        assert_ok(read_full_file(path, 4096, &text, NULL));
        assert_string_equal(text, "99");
        assert_ok(rm_rf(dir));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_writes_keep_their_order),
                cmocka_unit_test(test_remove_after_writes),
                cmocka_unit_test(test_unlink),
                cmocka_unit_test(test_write_json),
                cmocka_unit_test(test_free_finishes_queued),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
