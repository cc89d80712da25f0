/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "macro.h"
#include "string-util.h"
#include "vm-ignition.h"

/* Every key of a 2.x object is named here or handled by the caller: a key nobody knows is an error,
 * not a setting silently lost on the way to 3.x. */
typedef struct Keys {
        const char *const *copy;    /* copied as they are */
        const char *const *handled; /* the caller's business */
} Keys;

static int fail(char **reterr_message, const char *fmt, ...) _printf_(2, 3);
static int fail(char **reterr_message, const char *fmt, ...) {
        va_list ap;
        char *m = NULL;

        va_start(ap, fmt);
        if (vasprintf(&m, fmt, ap) < 0)
                m = NULL;
        va_end(ap);
        if (!m)
                return -ENOMEM;
        free(*reterr_message);
        *reterr_message = m;
        return -EINVAL;
}

static bool in_list(const char *const *list, const char *key) {
        for (; list && *list; list++)
                if (streq(*list, key))
                        return true;
        return false;
}

/* Copies src's keys of keys->copy into dst (which may be src's translation so far). */
static int copy_keys(json_t *src, json_t *dst, const Keys *keys, const char *where, char **reterr_message) {
        const char *key;
        json_t *v;

        if (!json_is_object(src))
                return fail(reterr_message, "%s must be an object", where);
        json_object_foreach(src, key, v) {
                if (in_list(keys->copy, key)) {
                        if (json_object_set(dst, key, v) < 0)
                                return -ENOMEM;
                } else if (!in_list(keys->handled, key))
                        return fail(reterr_message, "%s.%s is not an Ignition 2.x setting", where, key);
        }
        return 0;
}

static json_t *array_or_fail(json_t *v, const char *where, char **reterr_message, int *r) {
        if (!v) {
                *r = 0;
                return NULL;
        }
        if (!json_is_array(v)) {
                *r = fail(reterr_message, "%s must be an array", where);
                return NULL;
        }
        *r = 1;
        return v;
}

/* A config reference ({source, verification}) and the lists of them: the same in both specs. */
static int translate_ignition(json_t *src, json_t *out, char **reterr_message) {
        static const char *const copy[] = { "timeouts", "security", "proxy", NULL },
                                 *const handled[] = { "version", "config", NULL };
        static const char *const config_handled[] = { "append", "replace", NULL };
        _cleanup_(json_decrefp) json_t *ign = json_object();
        json_t *config;
        int r;

        if (!ign)
                return -ENOMEM;
        r = copy_keys(src, ign, &(Keys){ copy, handled }, "ignition", reterr_message);
        if (r < 0)
                return r;
        if (json_object_set_new(ign, "version", json_string(VM_IGNITION_TARGET_VERSION)) < 0)
                return -ENOMEM;
        config = json_object_get(src, "config");
        if (config) {
                _cleanup_(json_decrefp) json_t *c = json_object();
                json_t *append, *replace;

                if (!c)
                        return -ENOMEM;
                r = copy_keys(config, c, &(Keys){ NULL, config_handled }, "ignition.config", reterr_message);
                if (r < 0)
                        return r;
                append = array_or_fail(
                        json_object_get(config, "append"), "ignition.config.append", reterr_message, &r);
                if (r < 0)
                        return r;
                if (append && json_object_set(c, "merge", append) < 0)
                        return -ENOMEM;
                replace = json_object_get(config, "replace");
                if (replace && json_object_set(c, "replace", replace) < 0)
                        return -ENOMEM;
                if (json_object_set(ign, "config", c) < 0)
                        return -ENOMEM;
        }
        return json_object_set(out, "ignition", ign) < 0 ? -ENOMEM : 0;
}

/* The path, owner and filesystem every 2.x node has; only the root filesystem maps onto 3.x. */
static int translate_node(json_t *src, json_t *dst, const Keys *keys, const char *where, char **reterr_message) {
        json_t *fs = json_object_get(src, "filesystem"), *path = json_object_get(src, "path");
        int r;

        r = copy_keys(src, dst, keys, where, reterr_message);
        if (r < 0)
                return r;
        if (fs && !(json_is_string(fs) && streq(json_string_value(fs), "root")))
                return fail(
                        reterr_message,
                        "%s.filesystem must be \"root\": a VM's disk layout is its image's, so the "
                        "filesystems of Ignition 2.x are not translated",
                        where);
        if (!json_is_string(path) || json_string_value(path)[0] != '/')
                return fail(reterr_message, "%s.path must be an absolute path", where);
        return 0;
}

static int set_data_url(json_t *dst, const char *contents) {
        _cleanup_free_ char *url = NULL;
        size_t n = strlen(contents), k;

        url = malloc(strlen("data:,") + 3 * n + 1);
        if (!url)
                return -ENOMEM;
        k = stpcpy(url, "data:,") - url;
        for (const char *p = contents; *p; p++) {
                unsigned char c = (unsigned char) *p;
                if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    strchr("-._~", c))
                        url[k++] = (char) c;
                else
                        k += (size_t) sprintf(url + k, "%%%02X", c);
        }
        url[k] = 0;
        return json_object_set_new(dst, "source", json_string(url)) < 0 ? -ENOMEM : 0;
}

static int translate_file(json_t *src, json_t *files, const char *where, char **reterr_message) {
        static const char *const copy[] = { "path", "mode", "user", "group", NULL },
                                 *const handled[] = { "filesystem", "contents", "append", "overwrite", NULL };
        _cleanup_(json_decrefp) json_t *f = json_object(), *contents = NULL;
        json_t *c = json_object_get(src, "contents"), *append = json_object_get(src, "append"),
               *overwrite = json_object_get(src, "overwrite");
        int r;

        if (!f)
                return -ENOMEM;
        r = translate_node(src, f, &(Keys){ copy, handled }, where, reterr_message);
        if (r < 0)
                return r;
        if (c && !json_is_object(c))
                return fail(reterr_message, "%s.contents must be an object", where);
        if ((append && !json_is_boolean(append)) || (overwrite && !json_is_boolean(overwrite)))
                return fail(reterr_message, "%s.append and .overwrite must be booleans", where);
        contents = c ? json_deep_copy(c) : json_object();
        if (!contents)
                return -ENOMEM;
        if (!json_object_get(contents, "source") && set_data_url(contents, "") < 0)
                return -ENOMEM;
        if (json_is_true(append)) {
                if (json_object_set_new(f, "append", json_pack("[O]", contents)) < 0)
                        return -ENOMEM;
        } else {
                /* 2.x replaces what is there unless told not to; 3.x only when told to */
                if (json_object_set(f, "contents", contents) < 0 ||
                    json_object_set_new(f, "overwrite", json_boolean(!json_is_false(overwrite))) < 0)
                        return -ENOMEM;
        }
        return json_array_append(files, f) < 0 ? -ENOMEM : 0;
}

/* A networkd unit (or its drop-in) as a 3.x file where networkd reads it. */
static int add_networkd_file(json_t *files, const char *unit, const char *dropin, const char *text) {
        _cleanup_free_ char *path = NULL;
        _cleanup_(json_decrefp) json_t *f = NULL, *contents = json_object();
        int r;

        if (!contents)
                return -ENOMEM;
        if ((dropin ? asprintf(&path, "/etc/systemd/network/%s.d/%s", unit, dropin) :
                      asprintf(&path, "/etc/systemd/network/%s", unit)) < 0)
                return -ENOMEM;
        r = set_data_url(contents, text);
        if (r < 0)
                return r;
        f = json_pack("{s:s, s:O, s:i, s:b}", "path", path, "contents", contents, "mode", 0644, "overwrite", 1);
        if (!f || json_array_append(files, f) < 0)
                return -ENOMEM;
        return 0;
}

/* networkd.units: files under /etc/systemd/network, where networkd reads them. */
static int translate_networkd(json_t *src, json_t *files, char **reterr_message) {
        static const char *const handled[] = { "units", NULL },
                                 *const unit_handled[] = { "name", "contents", "dropins", NULL },
                                 *const dropin_handled[] = { "name", "contents", NULL };
        json_t *units, *u, *d;
        size_t i, j;
        int r;

        r = copy_keys(src, NULL, &(Keys){ NULL, handled }, "networkd", reterr_message);
        if (r < 0)
                return r;
        units = array_or_fail(json_object_get(src, "units"), "networkd.units", reterr_message, &r);
        if (r < 0)
                return r;
        json_array_foreach(units, i, u) {
                const char *name = json_string_value(json_object_get(u, "name"));
                json_t *dropins;

                r = copy_keys(u, NULL, &(Keys){ NULL, unit_handled }, "networkd.units[]", reterr_message);
                if (r < 0)
                        return r;
                if (!name || !*name || strchr(name, '/'))
                        return fail(reterr_message, "networkd.units[%zu].name must be a file name", i);
                if (json_object_get(u, "contents")) {
                        const char *text = json_string_value(json_object_get(u, "contents"));

                        if (!text)
                                return fail(reterr_message, "networkd.units[%zu].contents must be a string", i);
                        r = add_networkd_file(files, name, NULL, text);
                        if (r < 0)
                                return r;
                }
                dropins = array_or_fail(
                        json_object_get(u, "dropins"), "networkd.units[].dropins", reterr_message, &r);
                if (r < 0)
                        return r;
                json_array_foreach(dropins, j, d) {
                        const char *dname = json_string_value(json_object_get(d, "name")),
                                   *text = json_string_value(json_object_get(d, "contents"));

                        r = copy_keys(
                                d,
                                NULL,
                                &(Keys){ NULL, dropin_handled },
                                "networkd.units[].dropins[]",
                                reterr_message);
                        if (r < 0)
                                return r;
                        if (!dname || !*dname || strchr(dname, '/') || !text)
                                return fail(
                                        reterr_message,
                                        "networkd.units[%zu].dropins[%zu] needs a file name and contents",
                                        i,
                                        j);
                        r = add_networkd_file(files, name, dname, text);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

static int translate_storage(json_t *src, json_t *out, json_t *files, char **reterr_message) {
        static const char *const handled[] = { "files", "directories", "links", "disks",
                                               "raid",  "filesystems", NULL },
                                 *const dir_copy[] = { "path", "mode", "user", "group", "overwrite", NULL },
                                 *const link_copy[] = { "path",  "target",    "hard", "user",
                                                        "group", "overwrite", NULL },
                                 *const node_handled[] = { "filesystem", NULL };
        static const char *const unsupported[] = { "disks", "raid", "filesystems" };
        _cleanup_(json_decrefp) json_t *storage = json_object(), *dirs = json_array(), *links = json_array();
        json_t *list, *e;
        size_t i;
        int r;

        if (!storage || !dirs || !links)
                return -ENOMEM;
        r = copy_keys(src, NULL, &(Keys){ NULL, handled }, "storage", reterr_message);
        if (r < 0)
                return r;
        for (size_t u = 0; u < ELEMENTSOF(unsupported); u++) {
                json_t *v = json_object_get(src, unsupported[u]);
                if (v && !(json_is_array(v) && json_array_size(v) == 0))
                        return fail(
                                reterr_message,
                                "storage.%s is not supported: a VM's disk layout is its image's",
                                unsupported[u]);
        }
        list = array_or_fail(json_object_get(src, "files"), "storage.files", reterr_message, &r);
        if (r < 0)
                return r;
        json_array_foreach(list, i, e) {
                char where[64];
                (void) snprintf(where, sizeof(where), "storage.files[%zu]", i);
                r = translate_file(e, files, where, reterr_message);
                if (r < 0)
                        return r;
        }
        for (int k = 0; k < 2; k++) {
                const char *name = k == 0 ? "directories" : "links";
                json_t *dst_list = k == 0 ? dirs : links;

                list = array_or_fail(json_object_get(src, name), name, reterr_message, &r);
                if (r < 0)
                        return r;
                json_array_foreach(list, i, e) {
                        _cleanup_(json_decrefp) json_t *node = json_object();
                        char where[64];

                        if (!node)
                                return -ENOMEM;
                        (void) snprintf(where, sizeof(where), "storage.%s[%zu]", name, i);
                        r = translate_node(
                                e,
                                node,
                                &(Keys){ k == 0 ? dir_copy : link_copy, node_handled },
                                where,
                                reterr_message);
                        if (r < 0)
                                return r;
                        if (k == 1 && !json_is_string(json_object_get(e, "target")))
                                return fail(reterr_message, "%s.target must be a string", where);
                        if (json_array_append(dst_list, node) < 0)
                                return -ENOMEM;
                }
        }
        if ((json_array_size(dirs) > 0 && json_object_set(storage, "directories", dirs) < 0) ||
            (json_array_size(links) > 0 && json_object_set(storage, "links", links) < 0) ||
            json_object_set(out, "storage", storage) < 0)
                return -ENOMEM;
        return 0;
}

static int translate_systemd(json_t *src, json_t *out, char **reterr_message) {
        static const char *const handled[] = { "units", NULL }, *const unit_copy[] = { "name",    "enabled",
                                                                                       "mask",    "contents",
                                                                                       "dropins", NULL },
                                 *const unit_handled[] = { "enable", NULL };
        _cleanup_(json_decrefp) json_t *units = json_array();
        json_t *list, *u;
        size_t i;
        int r;

        if (!units)
                return -ENOMEM;
        r = copy_keys(src, NULL, &(Keys){ NULL, handled }, "systemd", reterr_message);
        if (r < 0)
                return r;
        list = array_or_fail(json_object_get(src, "units"), "systemd.units", reterr_message, &r);
        if (r < 0)
                return r;
        json_array_foreach(list, i, u) {
                _cleanup_(json_decrefp) json_t *unit = json_object();
                json_t *enable = json_object_get(u, "enable");

                if (!unit)
                        return -ENOMEM;
                r = copy_keys(u, unit, &(Keys){ unit_copy, unit_handled }, "systemd.units[]", reterr_message);
                if (r < 0)
                        return r;
                if (!json_is_string(json_object_get(u, "name")))
                        return fail(reterr_message, "systemd.units[%zu].name must be a string", i);
                /* 2.0's "enable" is 2.1's "enabled" */
                if (enable && !json_object_get(u, "enabled") && json_object_set(unit, "enabled", enable) < 0)
                        return -ENOMEM;
                if (json_array_append(units, unit) < 0)
                        return -ENOMEM;
        }
        return json_object_set_new(out, "systemd", json_pack("{s:O}", "units", units)) < 0 ? -ENOMEM : 0;
}

static int translate_passwd(json_t *src, json_t *out, char **reterr_message) {
        static const char
                *const handled[] = { "users", "groups", NULL },
                       *const user_copy[] = { "name",
                                              "passwordHash",
                                              "sshAuthorizedKeys",
                                              "uid",
                                              "gecos",
                                              "homeDir",
                                              "noCreateHome",
                                              "primaryGroup",
                                              "groups",
                                              "noUserGroup",
                                              "noLogInit",
                                              "shell",
                                              "system",
                                              NULL },
                       *const user_handled[] = { "create", NULL },
                       *const create_copy[] = { "uid",          "gecos",  "homeDir",     "noCreateHome",
                                                "primaryGroup", "groups", "noUserGroup", "noLogInit",
                                                "shell",        "system", NULL },
                       *const group_copy[] = { "name", "gid", "passwordHash", "system", NULL };
        _cleanup_(json_decrefp) json_t *passwd = json_object(), *users = json_array(), *groups = json_array();
        json_t *list, *e;
        size_t i;
        int r;

        if (!passwd || !users || !groups)
                return -ENOMEM;
        r = copy_keys(src, NULL, &(Keys){ NULL, handled }, "passwd", reterr_message);
        if (r < 0)
                return r;
        list = array_or_fail(json_object_get(src, "users"), "passwd.users", reterr_message, &r);
        if (r < 0)
                return r;
        json_array_foreach(list, i, e) {
                _cleanup_(json_decrefp) json_t *user = json_object(), *lifted = json_object();
                json_t *create = json_object_get(e, "create");
                const char *key;
                json_t *v;

                if (!user || !lifted)
                        return -ENOMEM;
                r = copy_keys(e, user, &(Keys){ user_copy, user_handled }, "passwd.users[]", reterr_message);
                if (r < 0)
                        return r;
                if (!json_is_string(json_object_get(e, "name")))
                        return fail(reterr_message, "passwd.users[%zu].name must be a string", i);
                /* 2.x's deprecated "create" object: its settings, where the user does not set them */
                if (create) {
                        r = copy_keys(
                                create,
                                lifted,
                                &(Keys){ create_copy, NULL },
                                "passwd.users[].create",
                                reterr_message);
                        if (r < 0)
                                return r;
                        json_object_foreach(
                                lifted,
                                key,
                                v) if (!json_object_get(user, key) && json_object_set(user, key, v) < 0) return -ENOMEM;
                }
                if (json_array_append(users, user) < 0)
                        return -ENOMEM;
        }
        list = array_or_fail(json_object_get(src, "groups"), "passwd.groups", reterr_message, &r);
        if (r < 0)
                return r;
        json_array_foreach(list, i, e) {
                _cleanup_(json_decrefp) json_t *group = json_object();

                if (!group)
                        return -ENOMEM;
                r = copy_keys(e, group, &(Keys){ group_copy, NULL }, "passwd.groups[]", reterr_message);
                if (r < 0)
                        return r;
                if (json_array_append(groups, group) < 0)
                        return -ENOMEM;
        }
        if ((json_array_size(users) > 0 && json_object_set(passwd, "users", users) < 0) ||
            (json_array_size(groups) > 0 && json_object_set(passwd, "groups", groups) < 0) ||
            json_object_set(out, "passwd", passwd) < 0)
                return -ENOMEM;
        return 0;
}

static bool is_v2(json_t *root) {
        const char *v = json_string_value(json_object_get(json_object_get(root, "ignition"), "version"));

        return v &&
                (streq(v, "2.0.0") || streq(v, "2.1.0") || streq(v, "2.2.0") || streq(v, "2.3.0") ||
                 streq(v, "2.4.0"));
}

int vm_ignition_translate(const char *data, size_t size, char **ret, char **reterr_message) {
        static const char *const handled[] = { "ignition", "storage", "systemd", "networkd", "passwd", NULL };
        _cleanup_(json_decrefp) json_t *root = NULL, *out = NULL, *files = NULL;
        _cleanup_free_ char *msg = NULL;
        json_t *storage, *networkd;
        char *text;
        int r;

        assert(data || size == 0);
        assert(ret);
        assert(reterr_message);

        root = json_loadb(data, size, JSON_REJECT_DUPLICATES, NULL);
        if (!json_is_object(root) || !is_v2(root))
                return 0;

        out = json_object();
        files = json_array();
        if (!out || !files)
                return -ENOMEM;
        r = copy_keys(root, NULL, &(Keys){ NULL, handled }, "user_data", &msg);
        if (r >= 0)
                r = translate_ignition(json_object_get(root, "ignition"), out, &msg);
        storage = json_object_get(root, "storage");
        if (r >= 0 && storage)
                r = translate_storage(storage, out, files, &msg);
        networkd = json_object_get(root, "networkd");
        if (r >= 0 && networkd)
                r = translate_networkd(networkd, files, &msg);
        if (r >= 0 && json_object_get(root, "systemd"))
                r = translate_systemd(json_object_get(root, "systemd"), out, &msg);
        if (r >= 0 && json_object_get(root, "passwd"))
                r = translate_passwd(json_object_get(root, "passwd"), out, &msg);
        if (r < 0) {
                if (r == -EINVAL)
                        *reterr_message = TAKE_PTR(msg);
                return r;
        }
        if (json_array_size(files) > 0) {
                json_t *st = json_object_get(out, "storage");
                if (!st) {
                        if (json_object_set_new(out, "storage", json_object()) < 0)
                                return -ENOMEM;
                        st = json_object_get(out, "storage");
                }
                if (json_object_set(st, "files", files) < 0)
                        return -ENOMEM;
        }
        text = json_dumps(out, JSON_COMPACT | JSON_SORT_KEYS);
        if (!text)
                return -ENOMEM;
        *ret = text;
        return 1;
}
