/* The socket plane's batched probe path (sixlab.dataplane.probeio): sendmmsg(2) of the
 * Session-Sender packets due in one run of the engine's timers, with Seq and T1 written
 * here right before the call, and recvmmsg(2) of the reflected packets with their
 * control messages and fixed fields decoded into records.
 *
 * Built at first use with the system gcc (-shared -fPIC), loaded with ctypes. Layouts
 * are shared with probeio.py: keep the two in step.
 *
 * Send buffer: records one after another, each SEND_HEAD bytes of header then the UDP
 * payload padded to 8 bytes:
 *   u32 payload length, u32 sockaddr length, u32 format (0 NTP, 1 PTP), u32 pad,
 *   i64 TAI - UTC offset (ns, PTP only), 32 bytes sockaddr (in6 or in).
 * The payload is an RFC 8762 §4.2.1 Session-Sender packet: Seq (bytes 0:4) comes from
 * seqs[i], Timestamp (bytes 4:12) from one CLOCK_REALTIME reading taken right before
 * sendmmsg, as an NTP (RFC 5905 §6, fraction rounded to nearest) or PTP truncated
 * timestamp: the arithmetic of sixlab.wire.timestamp.encode_timestamp.
 *
 * Receive records (RECV_REC bytes, struct recv_rec below): the kernel's receive time
 * (SO_TIMESTAMPNS), Hop Limit / TTL, Traffic Class / TOS, the packet-info destination,
 * the source, and, for payloads of at least 44 bytes, the RFC 8762 §4.3.1 reflector
 * fields with the NTP timestamps already in Unix-epoch ns (sixlab.wire.timestamp.
 * ns_from_ntp: RFC 4330 §3 era pivot, rounding, clamp); PTP ones (Z bit set) are left
 * raw for Python, which has the session's TAI offset.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>

#define MAX_BATCH 256
#define SEND_HEAD 56
#define CMSG_BYTES 256
#define NTP_UNIX_OFFSET_S 2208988800ULL
#define NS 1000000000ULL
/* sixlab.wire.timestamp.NTP_MAX_NS: the end of the era-1 half, as Unix-epoch ns */
#define NTP_MAX_NS ((int64_t)((1ULL << 32) + (1ULL << 31) - NTP_UNIX_OFFSET_S) * (int64_t)NS)

static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

struct recv_rec {
    int64_t t4;      /* kernel receive time, Unix-epoch UTC ns (0: none) */
    uint64_t ts[3];  /* T1 (sender's), T2, T3: ns when NTP, raw wire value when PTP */
    uint32_t len;    /* payload bytes */
    uint32_t seq;    /* the reflector's Seq */
    uint32_t sseq;   /* the sender's Seq */
    uint16_t ssid;
    uint16_t ree;    /* the reflector's Error Estimate */
    uint16_t see;    /* the sender's Error Estimate */
    uint16_t sport;  /* the source port */
    int16_t tclass;  /* -1: no control message */
    uint8_t hop;     /* Hop Limit / TTL the packet arrived with */
    uint8_t ttl;     /* Ses-Sender TTL field of the payload */
    uint8_t flags;   /* bit 0 truncated, bit 1 IPv4 source/destination */
    uint8_t pad[7];
    uint8_t src[16];
    uint8_t dst[16];
};

static uint64_t get_be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static void put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static uint64_t ntp_from_ns(int64_t ns)
{
    uint64_t sec = (uint64_t)ns / NS, nanos = (uint64_t)ns % NS;
    uint64_t frac = ((nanos << 32) + NS / 2) / NS;
    return (((sec + NTP_UNIX_OFFSET_S) & 0xFFFFFFFFULL) << 32) | frac;
}

static uint64_t ns_from_ntp(uint64_t ts)
{
    int64_t sec = (int64_t)(ts >> 32);
    uint64_t frac = ts & 0xFFFFFFFFULL;
    if (!(sec & 0x80000000LL))
        sec += 1LL << 32; /* era 1 */
    int64_t ns = (sec - (int64_t)NTP_UNIX_OFFSET_S) * (int64_t)NS
                 + (int64_t)((frac * NS + (1ULL << 31)) >> 32);
    return (uint64_t)(ns < NTP_MAX_NS - 1 ? ns : NTP_MAX_NS - 1);
}

/* Point msg/iov at the send record rec (SEND_HEAD layout) with Seq seq and the
 * Timestamp of wall written into its payload; returns the record's size in the buffer. */
static size_t fill_msg(uint8_t *rec, uint32_t seq, int64_t wall, struct mmsghdr *msg,
                       struct iovec *iov)
{
    uint32_t plen, alen, fmt;
    int64_t tai;
    memcpy(&plen, rec, 4);
    memcpy(&alen, rec + 4, 4);
    memcpy(&fmt, rec + 8, 4);
    memcpy(&tai, rec + 16, 8);
    uint8_t *payload = rec + SEND_HEAD;
    uint64_t stamp;
    if (fmt == 1) {
        uint64_t ns = (uint64_t)(wall + tai);
        stamp = (ns / NS) << 32 | (ns % NS);
    } else {
        stamp = ntp_from_ns(wall);
    }
    put_be(payload, seq, 4);
    put_be(payload + 4, stamp, 8);
    iov->iov_base = payload;
    iov->iov_len = plen;
    memset(msg, 0, sizeof(*msg));
    msg->msg_hdr.msg_name = rec + 24;
    msg->msg_hdr.msg_namelen = alen;
    msg->msg_hdr.msg_iov = iov;
    msg->msg_hdr.msg_iovlen = 1;
    return SEND_HEAD + ((plen + 7) & ~7U);
}

/* sendmmsg(2) of n prepared messages, a refused one skipped; the refusals. */
static int send_all(int fd, struct mmsghdr *msgs, int n, int *err)
{
    int failed = 0, i = 0;
    while (i < n) {
        int r = sendmmsg(fd, msgs + i, (unsigned)(n - i), MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            *err = errno; /* this one refused: count it, go on with the next */
            failed++;
            i++;
        } else {
            i += r;
        }
    }
    return failed;
}

static int64_t clock_ns(clockid_t id)
{
    struct timespec now;
    clock_gettime(id, &now);
    return (int64_t)now.tv_sec * (int64_t)NS + now.tv_nsec;
}

/* Send n records of buf; *t1 gets the wall time written into them. Returns the number
 * of packets the kernel refused (each one skipped, the rest still sent); *err the errno
 * of the last refusal. */
int pio_send(int fd, uint8_t *buf, int n, const uint32_t *seqs, int64_t *t1, int *err)
{
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    if (n > MAX_BATCH)
        n = MAX_BATCH;
    int64_t wall = clock_ns(CLOCK_REALTIME);
    *t1 = wall;
    *err = 0;
    size_t off = 0;
    for (int i = 0; i < n; i++)
        off += fill_msg(buf + off, seqs[i], wall, &msgs[i], &iov[i]);
    return send_all(fd, msgs, n, err);
}

/* Receive up to n datagrams into data (slot bytes each) and recs; the number received,
 * 0 when none waits, -errno on an error that is not an ICMP report (those are skipped:
 * they are not datagrams). */
int pio_recv(int fd, uint8_t *data, int slot, int n, struct recv_rec *recs)
{
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    struct sockaddr_in6 names[MAX_BATCH];
    static __thread uint8_t control[MAX_BATCH][CMSG_BYTES];
    if (n > MAX_BATCH)
        n = MAX_BATCH;
    memset(msgs, 0, sizeof(msgs[0]) * (size_t)n);
    for (int i = 0; i < n; i++) {
        iov[i].iov_base = data + (size_t)i * (size_t)slot;
        iov[i].iov_len = (size_t)slot;
        msgs[i].msg_hdr.msg_name = &names[i];
        msgs[i].msg_hdr.msg_namelen = sizeof(names[i]);
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_control = control[i];
        msgs[i].msg_hdr.msg_controllen = CMSG_BYTES;
    }
    int got;
    for (;;) {
        got = recvmmsg(fd, msgs, (unsigned)n, MSG_DONTWAIT, NULL);
        if (got >= 0)
            break;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        if (errno == EINTR || errno == ECONNREFUSED || errno == EHOSTUNREACH
            || errno == ENETUNREACH)
            continue;
        return -errno;
    }
    for (int i = 0; i < got; i++) {
        struct recv_rec *r = &recs[i];
        struct msghdr *h = &msgs[i].msg_hdr;
        const uint8_t *p = data + (size_t)i * (size_t)slot;
        memset(r, 0, sizeof(*r));
        r->tclass = -1;
        r->len = msgs[i].msg_len;
        if (h->msg_flags & MSG_TRUNC)
            r->flags |= 1;
        int v4 = 0;
        if (names[i].sin6_family == AF_INET6) {
            const uint8_t *a = names[i].sin6_addr.s6_addr;
            if (!memcmp(a, mapped, 12)) {
                v4 = 1;
                memcpy(r->src, a + 12, 4);
            } else {
                memcpy(r->src, a, 16);
            }
            r->sport = ntohs(names[i].sin6_port);
        } else {
            const struct sockaddr_in *s4 = (const struct sockaddr_in *)&names[i];
            v4 = 1;
            memcpy(r->src, &s4->sin_addr, 4);
            r->sport = ntohs(s4->sin_port);
        }
        if (v4)
            r->flags |= 2;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c; c = CMSG_NXTHDR(h, c)) {
            const void *v = CMSG_DATA(c);
            int iv;
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPNS) {
                struct timespec ts;
                memcpy(&ts, v, sizeof(ts));
                r->t4 = (int64_t)ts.tv_sec * (int64_t)NS + ts.tv_nsec;
            } else if (c->cmsg_level == IPPROTO_IPV6) {
                if (c->cmsg_type == IPV6_HOPLIMIT) {
                    memcpy(&iv, v, sizeof(iv));
                    r->hop = (uint8_t)iv;
                } else if (c->cmsg_type == IPV6_TCLASS) {
                    memcpy(&iv, v, sizeof(iv));
                    r->tclass = (int16_t)(iv & 0xFF);
                } else if (c->cmsg_type == IPV6_PKTINFO) {
                    struct in6_pktinfo pi;
                    memcpy(&pi, v, sizeof(pi));
                    const uint8_t *a = pi.ipi6_addr.s6_addr;
                    if (!memcmp(a, mapped, 12))
                        memcpy(r->dst, a + 12, 4); /* IPv4-mapped: as IPv4 */
                    else
                        memcpy(r->dst, a, 16);
                }
            } else if (c->cmsg_level == IPPROTO_IP) {
                if (c->cmsg_type == IP_TTL) {
                    memcpy(&iv, v, sizeof(iv));
                    r->hop = (uint8_t)iv;
                } else if (c->cmsg_type == IP_TOS) {
                    r->tclass = *(const uint8_t *)v;
                } else if (c->cmsg_type == IP_PKTINFO) {
                    struct in_pktinfo pi;
                    memcpy(&pi, v, sizeof(pi));
                    memcpy(r->dst, &pi.ipi_addr, 4);
                }
            }
        }
        if (r->len >= 44 && !(r->flags & 1)) {
            r->seq = (uint32_t)get_be(p, 4);
            uint64_t t3 = get_be(p + 4, 8);
            r->ree = (uint16_t)get_be(p + 12, 2);
            r->ssid = (uint16_t)get_be(p + 14, 2);
            uint64_t t2 = get_be(p + 16, 8);
            r->sseq = (uint32_t)get_be(p + 24, 4);
            uint64_t t1 = get_be(p + 28, 8);
            r->see = (uint16_t)get_be(p + 36, 2);
            r->ttl = p[40];
            int rptp = r->ree & 0x4000, sptp = r->see & 0x4000;
            r->ts[0] = sptp ? t1 : ns_from_ntp(t1);
            r->ts[1] = rptp ? t2 : ns_from_ntp(t2);
            r->ts[2] = rptp ? t3 : ns_from_ntp(t3);
        }
    }
    return got;
}

int pio_record_size(void)
{
    return (int)sizeof(struct recv_rec);
}

/* ----------------------------------------------------------------------------------
 * The compiled run loop (sixlab.dataplane.probeio.SendLoop, docs/architecture.md,
 * "Sender engine"): the send schedule of the sessions a SenderEngine hands over, kept
 * in a binary heap on CLOCK_MONOTONIC, served by sl_run with the GIL released. A run
 * takes every session whose slot is due, at most once per tick: Seq from the session's
 * counter, the next slot on the grid after now, next = due + ((now - due) / interval
 * + 1) * interval (sixlab.stamp.batch.due_seq: slots missed are skipped, never burst),
 * the schedule's slip counted as SenderEngine._slip counts it, then one CLOCK_REALTIME
 * reading and one sendmmsg per MAX_BATCH packets (T1 written right before it, as
 * pio_send). Each packet sent leaves an out record (struct sl_out) that the engine
 * hands to the session's core (sixlab.stamp.batch.sent_by_loop).
 *
 * Locking: the state's mutex is held by sl_run only while it runs the heap and
 * sends, never while it sleeps; every other sl_* function expects the caller to hold
 * it (sl_lock / sl_unlock), so that a control thread can take the out records, then
 * remove a session, with no send of it in between.
 */

#define SL_REC 512 /* bytes of one session's send record (SEND_HEAD + payload, padded) */
#define SL_WAKER 1 /* sl_run's reasons to return: the waker fd is readable */
#define SL_SOCKET 2 /* replies wait on the socket */
#define SL_UNTIL 4 /* the deadline came */
#define SL_FULL 8 /* the out records are (nearly) full */

struct sl_sess {
    int64_t due;        /* the next slot, CLOCK_MONOTONIC ns */
    int64_t interval;   /* ns */
    int64_t start;      /* the schedule's origin (slip) */
    int64_t last_slot;  /* slot of the last packet sent */
    int64_t skipped;    /* slots passed over */
    int64_t on_slot;    /* packets sent */
    int64_t late_total; /* ns after their slots, in total */
    int64_t late_max;
    uint32_t seq;       /* the next Seq */
    int32_t pos;        /* index in the heap; -1: not scheduled */
};

/* One packet sent (32 bytes; probeio.LOOP_OUT). */
struct sl_out {
    int64_t t1;   /* the wall time written into it, Unix-epoch UTC ns */
    int64_t now;  /* the run's monotonic time (the core's now) */
    int64_t next; /* the session's next slot */
    uint32_t idx; /* the session's index */
    uint32_t seq;
};

struct sl_state {
    pthread_mutex_t mu;
    int cap, heap_n, n_out, out_cap, failed, err;
    int64_t last_run;
    int32_t *heap;
    struct sl_sess *sess;
    uint8_t *arena; /* SL_REC bytes per session */
    struct sl_out *out;
};

static int sl_less(struct sl_state *st, int a, int b)
{
    return st->sess[st->heap[a]].due < st->sess[st->heap[b]].due;
}

static void sl_swap(struct sl_state *st, int a, int b)
{
    int32_t t = st->heap[a];
    st->heap[a] = st->heap[b];
    st->heap[b] = t;
    st->sess[st->heap[a]].pos = a;
    st->sess[st->heap[b]].pos = b;
}

static void sl_up(struct sl_state *st, int i)
{
    while (i > 0 && sl_less(st, i, (i - 1) / 2)) {
        sl_swap(st, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void sl_down(struct sl_state *st, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < st->heap_n && sl_less(st, l, m))
            m = l;
        if (r < st->heap_n && sl_less(st, r, m))
            m = r;
        if (m == i)
            return;
        sl_swap(st, i, m);
        i = m;
    }
}

static void sl_unheap(struct sl_state *st, int idx)
{
    int i = st->sess[idx].pos;
    if (i < 0)
        return;
    st->sess[idx].pos = -1;
    int last = --st->heap_n;
    if (i != last) {
        st->heap[i] = st->heap[last];
        st->sess[st->heap[i]].pos = i;
        sl_down(st, i);
        sl_up(st, i);
    }
}

static int sl_resize(struct sl_state *st, int cap)
{
    int32_t *heap = realloc(st->heap, sizeof(*heap) * (size_t)cap);
    if (heap)
        st->heap = heap;
    struct sl_sess *sess = realloc(st->sess, sizeof(*sess) * (size_t)cap);
    if (sess)
        st->sess = sess;
    uint8_t *arena = realloc(st->arena, (size_t)SL_REC * (size_t)cap);
    if (arena)
        st->arena = arena;
    if (!heap || !sess || !arena)
        return -1;
    for (int i = st->cap; i < cap; i++)
        st->sess[i].pos = -1;
    st->cap = cap;
    return 0;
}

void sl_free(struct sl_state *st)
{
    if (!st)
        return;
    pthread_mutex_destroy(&st->mu);
    free(st->heap);
    free(st->sess);
    free(st->arena);
    free(st->out);
    free(st);
}

/* A loop for up to cap sessions (sl_add grows it) and out_cap out records. */
struct sl_state *sl_new(int cap, int out_cap)
{
    struct sl_state *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    pthread_mutex_init(&st->mu, NULL);
    st->out = calloc((size_t)out_cap, sizeof(*st->out));
    st->out_cap = out_cap;
    st->last_run = INT64_MIN / 2;
    if (!st->out || sl_resize(st, cap < 1 ? 1 : cap)) {
        sl_free(st);
        return NULL;
    }
    return st;
}

void sl_lock(struct sl_state *st)
{
    pthread_mutex_lock(&st->mu);
}

void sl_unlock(struct sl_state *st)
{
    pthread_mutex_unlock(&st->mu);
}

/* Schedule session idx (not scheduled now): its send record rec (SEND_HEAD layout,
 * len bytes), next slot due, Seq seq, and the schedule's origin and last slot sent.
 * 0, or -1 when the record is too long or memory runs out (the engine keeps the
 * session on its Python path). */
int sl_add(struct sl_state *st, int idx, const uint8_t *rec, int len, int64_t due,
           int64_t interval, uint32_t seq, int64_t start, int64_t last_slot)
{
    if (idx < 0 || len > SL_REC || len < SEND_HEAD || interval <= 0)
        return -1;
    if (idx >= st->cap) {
        int cap = st->cap;
        while (cap <= idx)
            cap *= 2;
        if (sl_resize(st, cap))
            return -1;
    }
    struct sl_sess *s = &st->sess[idx];
    if (s->pos >= 0)
        return -1;
    memcpy(st->arena + (size_t)idx * SL_REC, rec, (size_t)len);
    memset(s, 0, sizeof(*s));
    s->due = due;
    s->interval = interval;
    s->start = start;
    s->last_slot = last_slot;
    s->seq = seq;
    s->pos = st->heap_n;
    st->heap[st->heap_n++] = idx;
    sl_up(st, s->pos);
    return 0;
}

/* Session idx's state into v: next slot, next Seq, skipped, packets sent, late ns
 * total and max, last slot; and, with remove, out of the schedule. -1: no such one. */
int sl_get(struct sl_state *st, int idx, int remove, int64_t *v)
{
    if (idx < 0 || idx >= st->cap || st->sess[idx].pos < 0)
        return -1;
    struct sl_sess *s = &st->sess[idx];
    v[0] = s->due;
    v[1] = s->seq;
    v[2] = s->skipped;
    v[3] = s->on_slot;
    v[4] = s->late_total;
    v[5] = s->late_max;
    v[6] = s->last_slot;
    if (remove)
        sl_unheap(st, idx);
    return 0;
}

/* Move the out records into dst (room for out_cap); how many. *failed: packets the
 * kernel refused since the last take, *err the errno of the last. */
int sl_take(struct sl_state *st, struct sl_out *dst, int *failed, int *err)
{
    int n = st->n_out;
    memcpy(dst, st->out, sizeof(*dst) * (size_t)n);
    st->n_out = 0;
    *failed = st->failed;
    *err = st->err;
    st->failed = 0;
    st->err = 0;
    return n;
}

/* One run of the due slots at monotonic now (mutex held): 1 when a slot was due. */
static int sl_pass(struct sl_state *st, int fd, int64_t now)
{
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    int first = st->n_out, k = 0;
    while (st->heap_n && st->sess[st->heap[0]].due <= now && st->n_out < st->out_cap) {
        int idx = st->heap[0];
        struct sl_sess *s = &st->sess[idx];
        int64_t slot = (now - s->start) / s->interval, late = (now - s->start) % s->interval;
        if (slot > s->last_slot + 1)
            s->skipped += slot - s->last_slot - 1;
        s->on_slot++;
        s->late_total += late;
        if (late > s->late_max)
            s->late_max = late;
        s->last_slot = slot;
        struct sl_out *o = &st->out[st->n_out++];
        o->idx = (uint32_t)idx;
        o->seq = s->seq++;
        o->now = now;
        s->due += ((now - s->due) / s->interval + 1) * s->interval;
        o->next = s->due;
        sl_down(st, 0);
        if (++k == MAX_BATCH || st->n_out == st->out_cap
            || !(st->heap_n && st->sess[st->heap[0]].due <= now)) {
            int64_t wall = clock_ns(CLOCK_REALTIME);
            for (int i = 0; i < k; i++) {
                struct sl_out *p = &st->out[first + i];
                p->t1 = wall;
                fill_msg(st->arena + (size_t)p->idx * SL_REC, p->seq, wall, &msgs[i], &iov[i]);
            }
            int err = 0, failed = send_all(fd, msgs, k, &err);
            if (failed) {
                st->failed += failed;
                st->err = err;
            }
            first += k;
            k = 0;
        }
    }
    return first > 0 || k > 0;
}

/* Run the schedule until monotonic ns until, or until the waker fd or (while no run
 * is due within hold ns) the socket is readable, or the out records are full; a run at
 * most once per tick ns. Which of those ended it (SL_* bits); -errno when poll fails. */
int sl_run(struct sl_state *st, int fd, int waker, int64_t until, int64_t tick, int64_t hold)
{
    for (;;) {
        int64_t now = clock_ns(CLOCK_MONOTONIC);
        pthread_mutex_lock(&st->mu);
        int ran = 0, n_before = st->n_out;
        if (st->heap_n && st->sess[st->heap[0]].due <= now && now - st->last_run >= tick) {
            sl_pass(st, fd, now);
            st->last_run = now;
            ran = st->n_out > n_before;
        }
        int full = st->n_out + MAX_BATCH > st->out_cap;
        int64_t next = until;
        if (st->heap_n) {
            int64_t due = st->sess[st->heap[0]].due, after = st->last_run + tick;
            due = due > after ? due : after;
            next = due < until ? due : until;
        }
        int64_t pending = st->heap_n;
        pthread_mutex_unlock(&st->mu);
        if (full)
            return SL_FULL;
        struct pollfd fds[2] = {{waker, POLLIN, 0}, {fd, POLLIN, 0}};
        if (ran) { /* replies to earlier packets: the engine reads them now */
            if (poll(fds + 1, 1, 0) > 0)
                return SL_SOCKET;
        }
        now = clock_ns(CLOCK_MONOTONIC);
        if (now >= until)
            return SL_UNTIL;
        int64_t wait = next - now;
        if (wait <= 0)
            continue;
        int watch = !pending || wait > hold;
        struct timespec ts = {wait / (int64_t)NS, wait % (int64_t)NS};
        int r = ppoll(fds, watch ? 2 : 1, &ts, NULL);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        int why = 0;
        if (fds[0].revents)
            why |= SL_WAKER;
        if (watch && fds[1].revents)
            why |= SL_SOCKET;
        if (why)
            return why;
    }
}

int sl_session_size(void)
{
    return (int)sizeof(struct sl_sess);
}

int sl_out_size(void)
{
    return (int)sizeof(struct sl_out);
}
