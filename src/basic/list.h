/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Intrusive doubly linked lists, as systemd's list.h: an item has "prev" and "next" pointers, the
 * head is a pointer to the first item. Macros, so that one definition serves every item type. */

/* Puts item first in the list at head. */
#define LIST_PREPEND(head, item)               \
        do {                                   \
                (item)->prev = NULL;           \
                (item)->next = (head);         \
                if (head)                      \
                        (head)->prev = (item); \
                (head) = (item);               \
        } while (0)

/* Takes item out of the list at head; its own pointers are cleared. */
#define LIST_REMOVE(head, item)                            \
        do {                                               \
                if ((item)->prev)                          \
                        (item)->prev->next = (item)->next; \
                else                                       \
                        (head) = (item)->next;             \
                if ((item)->next)                          \
                        (item)->next->prev = (item)->prev; \
                (item)->prev = (item)->next = NULL;        \
        } while (0)
