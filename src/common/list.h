/* list.h — an intrusive circular doubly-linked list (a node embedded in each element) and
 * container_of, shared by every component that queues things. */
#ifndef BATON_COMMON_LIST_H
#define BATON_COMMON_LIST_H

#include <stddef.h>

/* The element that embeds `member` at ptr. */
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* A head and a node are the same type. An initialised node that is in no list points at itself,
 * so baton_list_empty(node) also tells whether a node is linked. Not thread-safe. */
typedef struct baton_list_s {
    struct baton_list_s *prev, *next;
} baton_list_t;

static inline void baton_list_init(baton_list_t *l)
{
    l->prev = l->next = l;
}

static inline int baton_list_empty(const baton_list_t *l)
{
    return l->next == l;
}

/* Appends n (not linked) at the tail. */
static inline void baton_list_push(baton_list_t *head, baton_list_t *n)
{
    n->prev = head->prev;
    n->next = head;
    head->prev->next = n;
    head->prev = n;
}

/* Inserts n (not linked) at the head. */
static inline void baton_list_push_front(baton_list_t *head, baton_list_t *n)
{
    baton_list_push(head->next, n);
}

/* Unlinks n (linked) and leaves it pointing at itself. */
static inline void baton_list_remove(baton_list_t *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}

/* The first node, or NULL when empty. */
static inline baton_list_t *baton_list_first(const baton_list_t *head)
{
    return head->next == head ? NULL : head->next;
}

/* Moves every node of src to the end of dst. */
static inline void baton_list_splice(baton_list_t *dst, baton_list_t *src)
{
    if (baton_list_empty(src))
        return;
    src->next->prev = dst->prev;
    dst->prev->next = src->next;
    src->prev->next = dst;
    dst->prev = src->prev;
    baton_list_init(src);
}

#endif
