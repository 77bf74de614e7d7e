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
#include <unistd.h>
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
 * The compiled run loop (sixlab.dataplane.probeio.SendLoop; docs/architecture.md,
 * "Time"): the sessions a SenderEngine hands over, served by sl_run with the
 * GIL released. Each is an unauthenticated RFC 8762 session whose packets differ only
 * in Seq and Timestamp and whose replies carry no TLV (44 bytes, RFC 8762 §4.3.1).
 *
 * Send: a binary heap of the sessions' slots on CLOCK_MONOTONIC; a run, at most once
 * per tick, takes every due slot: Seq from the session's counter, the next slot on the
 * grid after now, next = due + ((now - due) / interval + 1) * interval (the arithmetic
 * of sixlab.stamp.batch.due_seq: slots missed are skipped, never burst), the slip
 * counted as SenderEngine._slip counts it, then one CLOCK_REALTIME reading and one
 * sendmmsg per MAX_BATCH packets (T1 written right before it, as pio_send).
 *
 * Receive: at each run and whenever the socket wakes the loop (only while no run is
 * due within hold ns, as the engine's Python loop does), recvmmsg (pio_recv) and, per
 * reply, what sixlab.stamp.batch.receive_record does for such a session: expire the
 * packets whose loss deadline passed (before the reply), drop a zero Multiplier
 * (RFC 4656 §4.1.2), match the sender's Seq to the packets outstanding (a window of
 * Seq -> T1, deadline per session), tell a duplicate (the session core's answered
 * bitmap, written in place) from a late or unknown Seq, check the echoed T1 exactly,
 * count reordering against the highest Seq answered. Every outcome is an out record
 * (struct sl_out) that the engine turns into the core's counters and events.
 *
 * What the loop does not answer goes back to the engine untouched, in arrival order:
 * every reply of a batch that is not a held session's plain 44-byte reply (SSID 0,
 * another SSID, short, long, truncated) is left at the start of the receive buffers
 * (sl_take reports how many) and sl_run returns at the batch's end; a held session that
 * got such a reply leaves the loop first (an SL_EVICT record: the engine gives its
 * state back to the core, which answers from then on). A reply with SSID 0 concerns
 * only the held sessions that claim it by Seq and T1 (sl_zero).
 *
 * Locking: the state's mutex is held by sl_run while it runs, never while it sleeps;
 * every other sl_* function expects the caller to hold it (sl_lock / sl_unlock).
 */

#define SL_REC 512 /* bytes of one session's send record (SEND_HEAD + payload, padded) */
#define SL_WAKER 1 /* sl_run's reasons to return: the waker fd is readable */
#define SL_SOCKET 2 /* replies the loop leaves to the engine */
#define SL_UNTIL 4 /* the deadline came */
#define SL_FULL 8 /* the out records are (nearly) full */
#define SL_NONE INT64_MIN
/* Buckets of the count of packets outstanding by T1 (sl_zero's first test). */
#define SL_T1_BITS 18
#define SL_T1_BUCKETS (1u << SL_T1_BITS)
#define DUP_WINDOW 65536 /* sixlab.stamp.sender.DUPLICATE_WINDOW: bits of answered */
#define Z_BIT 0x4000

enum { SL_SENT = 1, SL_RESULT, SL_LOST, SL_DUP, SL_DROP, SL_EVICT };
/* Drop reasons of an SL_DROP record (probeio.LOOP_DROPS maps them to DropReason). */
enum { SL_LATE = 1, SL_UNKNOWN_SEQ, SL_BAD_TIMESTAMP, SL_MULTIPLIER_ZERO, SL_SSID_ZERO_STRAY };

struct sl_slot { /* one packet in a session's window */
    int64_t t1;       /* UTC ns */
    int64_t deadline; /* monotonic ns; SL_NONE: answered, lost or never sent */
    uint32_t seq;
    uint32_t pad;
};

struct sl_sess {
    int64_t due;        /* the next slot, CLOCK_MONOTONIC ns */
    int64_t interval;   /* ns */
    int64_t start;      /* the schedule's origin (slip) */
    int64_t last_slot;  /* slot of the last packet sent */
    int64_t skipped;    /* slots passed over */
    int64_t on_slot;    /* packets sent */
    int64_t late_total; /* ns after their slots, in total */
    int64_t late_max;
    int64_t loss;       /* the loss timeout, ns */
    int64_t tai;        /* TAI - UTC, ns (PTP timestamps) */
    int64_t highest;    /* the highest Seq answered; -1: none */
    struct sl_slot *win;
    uint8_t *answered;  /* the core's answered bitmap (DUP_WINDOW bits), not owned */
    uint32_t seq;       /* the next Seq */
    uint32_t oldest;    /* the oldest Seq that may still be outstanding */
    uint32_t mask;      /* window slots - 1 */
    int32_t pos;        /* index in the heap; -1: not scheduled */
    uint16_t ssid;
    uint8_t held;       /* in the loop (0: free, or left it and not yet taken back) */
    uint8_t echoed;     /* a reply with its own SSID was answered: RFC 8972 reflector */
    uint8_t pad[4];
};

/* One out record (48 bytes; probeio.LOOP_OUT). */
struct sl_out {
    int64_t t1;   /* T1 of the packet, UTC ns */
    int64_t a;    /* SENT: the run's monotonic time; RESULT: T2 */
    int64_t b;    /* SENT: the next slot; RESULT: T3 */
    int64_t c;    /* RESULT: T4 */
    uint32_t idx; /* the session's index */
    uint32_t seq; /* the sender's Seq */
    uint32_t rseq; /* RESULT: the reflector's Seq; DROP: the reason */
    uint16_t ree; /* RESULT: the reflector's Error Estimate */
    uint8_t kind; /* SL_SENT ...; RESULT | 0x80: reordered */
    uint8_t ttl;  /* RESULT: Ses-Sender TTL */
};

struct sl_state {
    pthread_mutex_t mu;
    int cap, heap_n, n_out, out_cap, failed, err, n_left, received, slot;
    int rx_next, rx_got; /* replies of the last recvmmsg handled, and received */
    int left_new;        /* n_left not yet reported by sl_take */
    int left_at;         /* replies of the current batch left so far */
    int64_t rx_mono, rx_wall, last_run;
    int32_t *heap;
    struct sl_sess *sess;
    uint8_t *arena; /* SL_REC bytes per session */
    struct sl_out *out;
    int32_t by_ssid[65536]; /* held session's index by SSID; -1: none */
    uint32_t *t1s;          /* packets outstanding by T1 on the wire (sl_t1), hashed */
    uint8_t *data;          /* the receive buffers (ProbeIO.data, .records) */
    struct recv_rec *recs;
};

/* The bucket of st->t1s of a T1 as the wire carries it, in ns: UTC for NTP, TAI for
 * PTP (a slot's UTC T1 plus its session's TAI - UTC, which is 0 for NTP sessions). */
static uint32_t sl_t1(int64_t wire_ns)
{
    return (uint32_t)(((uint64_t)wire_ns * 0x9E3779B97F4A7C15ULL) >> (64 - SL_T1_BITS));
}

/* Count slot w of session s in or out of st->t1s (it becomes outstanding, or stops). */
static void sl_count(struct sl_state *st, const struct sl_sess *s, const struct sl_slot *w,
                     int by)
{
    st->t1s[sl_t1(w->t1 + s->tai)] += (uint32_t)by;
}

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
    memset(st->sess + st->cap, 0, sizeof(*sess) * (size_t)(cap - st->cap));
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
    for (int i = 0; i < st->cap; i++)
        free(st->sess[i].win);
    free(st->heap);
    free(st->sess);
    free(st->arena);
    free(st->out);
    free(st->t1s);
    free(st);
}

/* A loop for up to cap sessions (sl_add grows it), out_cap out records, receiving
 * into data (MAX_BATCH slots of slot bytes) and recs (MAX_BATCH records). */
struct sl_state *sl_new(int cap, int out_cap, uint8_t *data, int slot, struct recv_rec *recs)
{
    struct sl_state *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    pthread_mutex_init(&st->mu, NULL);
    st->out = calloc((size_t)out_cap, sizeof(*st->out));
    st->t1s = calloc(SL_T1_BUCKETS, sizeof(*st->t1s));
    st->out_cap = out_cap;
    st->last_run = INT64_MIN / 2;
    st->data = data;
    st->slot = slot;
    st->recs = recs;
    for (int i = 0; i < 65536; i++)
        st->by_ssid[i] = -1;
    if (!st->out || !st->t1s || sl_resize(st, cap < 1 ? 1 : cap)) {
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

/* Hand session idx (a free index) to the loop. cfg: next slot due, interval, the
 * schedule's origin, last slot sent, loss timeout, TAI - UTC (ns), highest Seq
 * answered (-1: none), whether a reply with its SSID was answered; seq: its next
 * Seq; ssid; window: 2^k slots, at least the packets that can be outstanding (loss
 * timeout / interval + 2); out: the packets outstanding, n (Seq, T1, deadline)
 * triples in Seq order; answered: the core's bitmap. 0, or -1 when the loop cannot take it (the engine keeps it on Python): among
 * others, a window whose losses, with the send or reply that finds them, would not fit
 * in empty out records (it would never be served). */
int sl_add(struct sl_state *st, int idx, const uint8_t *rec, int len, const int64_t *cfg,
           uint32_t seq, uint16_t ssid, int window, const int64_t *out, int n,
           uint8_t *answered)
{
    if (idx < 0 || len > SL_REC || len < SEND_HEAD || cfg[1] <= 0 || cfg[4] <= 0
        || ssid == 0 || window < 1 || (window & (window - 1)) || window + 3 > st->out_cap
        || n < 0 || n > window || st->by_ssid[ssid] >= 0 || !answered)
        return -1;
    if (idx >= st->cap) {
        int cap = st->cap;
        while (cap <= idx)
            cap *= 2;
        if (sl_resize(st, cap))
            return -1;
    }
    struct sl_sess *s = &st->sess[idx];
    if (s->held || s->win)
        return -1;
    struct sl_slot *win = malloc(sizeof(*win) * (size_t)window);
    if (!win)
        return -1;
    for (int i = 0; i < window; i++)
        win[i].deadline = SL_NONE;
    memcpy(st->arena + (size_t)idx * SL_REC, rec, (size_t)len);
    memset(s, 0, sizeof(*s));
    s->due = cfg[0];
    s->interval = cfg[1];
    s->start = cfg[2];
    s->last_slot = cfg[3];
    s->loss = cfg[4];
    s->tai = cfg[5];
    s->highest = cfg[6];
    s->echoed = cfg[7] != 0;
    s->seq = seq;
    s->oldest = n ? (uint32_t)out[0] : seq;
    s->mask = (uint32_t)window - 1;
    s->win = win;
    s->answered = answered;
    s->ssid = ssid;
    for (int i = 0; i < n; i++) {
        uint32_t q = (uint32_t)out[3 * i];
        if (seq - q > (uint32_t)window || seq - q == 0) { /* outside the window */
            free(win);
            s->win = NULL;
            return -1;
        }
        win[q & s->mask] = (struct sl_slot){out[3 * i + 1], out[3 * i + 2], q, 0};
    }
    for (uint32_t i = 0; i <= s->mask; i++)
        if (win[i].deadline != SL_NONE)
            sl_count(st, s, &win[i], 1);
    s->held = 1;
    st->by_ssid[ssid] = idx;
    s->pos = st->heap_n;
    st->heap[st->heap_n++] = idx;
    sl_up(st, s->pos);
    return 0;
}

/* Session idx's state into v: next slot, next Seq, skipped, packets sent, late ns
 * total and max, last slot, highest Seq answered (-1: none), whether still held; and
 * into win (room for its window: 3 int64 per packet) the packets outstanding, Seq,
 * T1, deadline, in Seq order. The number of those; -1: no such session. With remove,
 * the session leaves the loop and its index is free again. */
int sl_get(struct sl_state *st, int idx, int remove, int64_t *v, int64_t *win, int room)
{
    if (idx < 0 || idx >= st->cap || !st->sess[idx].win)
        return -1;
    struct sl_sess *s = &st->sess[idx];
    v[0] = s->due;
    v[1] = s->seq;
    v[2] = s->skipped;
    v[3] = s->on_slot;
    v[4] = s->late_total;
    v[5] = s->late_max;
    v[6] = s->last_slot;
    v[7] = s->highest;
    v[8] = s->held;
    int n = 0;
    for (uint32_t q = s->oldest; q != s->seq && n < room; q++) {
        struct sl_slot *w = &s->win[q & s->mask];
        if (w->deadline != SL_NONE && w->seq == q) {
            win[3 * n] = q;
            win[3 * n + 1] = w->t1;
            win[3 * n + 2] = w->deadline;
            n++;
        }
    }
    if (remove) {
        for (uint32_t i = 0; i <= s->mask; i++)
            if (s->win[i].deadline != SL_NONE)
                sl_count(st, s, &s->win[i], -1);
        sl_unheap(st, idx);
        if (s->held && st->by_ssid[s->ssid] == idx)
            st->by_ssid[s->ssid] = -1;
        s->held = 0;
        free(s->win);
        s->win = NULL;
    }
    return n;
}

/* Move the out records into dst (room for out_cap); how many. counts: packets the
 * kernel refused since the last take, the errno of the last, datagrams received,
 * datagrams left in the receive buffers for the engine (at their start; reported by
 * one take, and nothing more is received until sl_left_done). */
int sl_take(struct sl_state *st, struct sl_out *dst, int *counts)
{
    int n = st->n_out;
    memcpy(dst, st->out, sizeof(*dst) * (size_t)n);
    st->n_out = 0;
    counts[0] = st->failed;
    counts[1] = st->err;
    counts[2] = st->received;
    counts[3] = st->left_new; /* once; receiving waits for sl_left_done */
    st->left_new = 0;
    st->failed = st->err = st->received = 0;
    return n;
}

/* The datagrams sl_take reported left for the engine are handled. */
void sl_left_done(struct sl_state *st)
{
    st->n_left = 0;
}

static struct sl_out *sl_emit(struct sl_state *st, int kind, int idx, uint32_t seq)
{
    struct sl_out *o = &st->out[st->n_out++];
    memset(o, 0, sizeof(*o));
    o->kind = (uint8_t)kind;
    o->idx = (uint32_t)idx;
    o->seq = seq;
    return o;
}

/* The packets of session idx whose loss deadline is at or before now: lost. */
static void sl_expire(struct sl_state *st, int idx, int64_t now)
{
    struct sl_sess *s = &st->sess[idx];
    while (s->oldest != s->seq) {
        struct sl_slot *w = &s->win[s->oldest & s->mask];
        if (w->deadline != SL_NONE && w->seq == s->oldest) {
            if (w->deadline > now)
                return;
            sl_emit(st, SL_LOST, idx, w->seq)->t1 = w->t1;
            sl_count(st, s, w, -1);
            w->deadline = SL_NONE;
        }
        s->oldest++;
    }
}

/* One run of the due slots at monotonic now (mutex held; room for them in out). */
static void sl_pass(struct sl_state *st, int fd, int64_t now)
{
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    struct sl_out *batch[MAX_BATCH];
    int k = 0;
    /* Room: each session due leaves a SENT record and at most its window of LOST. */
    while (st->heap_n && st->sess[st->heap[0]].due <= now
           && st->n_out + 1 + (int)st->sess[st->heap[0]].mask + 1 < st->out_cap) {
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
        uint32_t seq = s->seq++;
        uint32_t bit = seq % DUP_WINDOW; /* its answered bit, last the Seq's a window ago */
        s->answered[bit >> 3] &= (uint8_t) ~(1u << (bit & 7));
        struct sl_slot *w = &s->win[seq & s->mask];
        if (w->deadline != SL_NONE) { /* cannot be: the window holds loss / interval + 2 */
            sl_emit(st, SL_LOST, idx, w->seq)->t1 = w->t1;
            sl_count(st, s, w, -1);
        }
        if (s->oldest == seq - s->mask - 1)
            s->oldest++;
        /* T1, and so its count in t1s, at the send below: a loss timeout above 0
         * (sl_add) keeps the slot outstanding until then */
        *w = (struct sl_slot){0, now + s->loss, seq, 0};
        struct sl_out *o = sl_emit(st, SL_SENT, idx, seq);
        o->a = now;
        s->due += ((now - s->due) / s->interval + 1) * s->interval;
        o->b = s->due;
        batch[k++] = o;
        sl_expire(st, idx, now);
        sl_down(st, 0);
        if (k == MAX_BATCH
            || !(st->heap_n && st->sess[st->heap[0]].due <= now
                 && st->n_out + 1 + (int)st->sess[st->heap[0]].mask + 1 < st->out_cap)) {
            int64_t wall = clock_ns(CLOCK_REALTIME);
            for (int i = 0; i < k; i++) {
                struct sl_out *p = batch[i];
                struct sl_sess *ps = &st->sess[p->idx];
                p->t1 = wall;
                struct sl_slot *pw = &ps->win[p->seq & ps->mask];
                pw->t1 = wall;
                sl_count(st, ps, pw, 1);
                fill_msg(st->arena + (size_t)p->idx * SL_REC, p->seq, wall, &msgs[i], &iov[i]);
            }
            int err = 0, failed = send_all(fd, msgs, k, &err);
            if (failed) {
                st->failed += failed;
                st->err = err;
            }
            k = 0;
        }
    }
}

/* A timestamp of a reply in UTC ns (pio_recv leaves PTP ones raw): -1 when a PTP
 * nanoseconds field is not below 10^9 (sixlab.wire.timestamp.ns_from_ptp refuses it). */
static int utc(uint64_t ts, int ptp, int64_t tai, int64_t *out)
{
    if (!ptp) {
        *out = (int64_t)ts;
        return 0;
    }
    uint64_t nanos = ts & 0xFFFFFFFFULL;
    if (nanos >= NS)
        return -1;
    *out = (int64_t)((ts >> 32) * NS + nanos) - tai;
    return 0;
}

static void sl_evict(struct sl_state *st, int idx);

/* One reply r of held session idx, arrived at monotonic now (receive_record): 0. A
 * reply that answers an outstanding packet but is not plain (longer than 44 bytes:
 * its record would carry what follows the base packet, RFC 8972 §4) takes the session
 * out of the loop instead (sl_evict) and is the engine's: 1. Every other one is
 * dropped here as the core would drop it, the session held (the core's checks come
 * before it reads what follows the base packet). */
static int sl_reply(struct sl_state *st, int idx, const struct recv_rec *r, int64_t now,
                    int64_t t4, int plain)
{
    struct sl_sess *s = &st->sess[idx];
    sl_expire(st, idx, now);
    uint32_t seq = r->sseq;
    if (!(r->ree & 0xFF)) {
        sl_emit(st, SL_DROP, idx, seq)->rseq = SL_MULTIPLIER_ZERO;
        return 0;
    }
    struct sl_slot *w = &s->win[seq & s->mask];
    if (w->deadline == SL_NONE || w->seq != seq) {
        uint32_t bit = seq % DUP_WINDOW;
        if ((uint32_t)(s->seq - 1 - seq) < DUP_WINDOW && (s->answered[bit >> 3] >> (bit & 7) & 1))
            sl_emit(st, SL_DUP, idx, seq);
        else
            sl_emit(st, SL_DROP, idx, seq)->rseq = seq < s->seq ? SL_LATE : SL_UNKNOWN_SEQ;
        return 0;
    }
    int64_t t1 = 0, t2 = 0, t3 = 0;
    int bad = utc(r->ts[0], r->see & Z_BIT, s->tai, &t1);
    bad |= utc(r->ts[1], r->ree & Z_BIT, s->tai, &t2);
    bad |= utc(r->ts[2], r->ree & Z_BIT, s->tai, &t3);
    if (bad || t1 != w->t1) {
        sl_emit(st, SL_DROP, idx, seq)->rseq = SL_BAD_TIMESTAMP;
        return 0;
    }
    if (!plain) {
        sl_evict(st, idx);
        return 1;
    }
    sl_count(st, s, w, -1);
    w->deadline = SL_NONE;
    s->echoed = 1;
    uint32_t bit = seq % DUP_WINDOW;
    s->answered[bit >> 3] |= (uint8_t)(1u << (bit & 7));
    int reordered = s->highest >= 0 && (int64_t)seq < s->highest;
    if (!reordered)
        s->highest = seq;
    struct sl_out *o = sl_emit(st, reordered ? SL_RESULT | 0x80 : SL_RESULT, idx, seq);
    o->t1 = w->t1;
    o->a = t2;
    o->b = t3;
    o->c = t4;
    o->rseq = r->seq;
    o->ree = r->ree;
    o->ttl = r->ttl;
    return 0;
}

/* Take a held session out of the loop for the engine (an SL_EVICT record). */
static void sl_evict(struct sl_state *st, int idx)
{
    struct sl_sess *s = &st->sess[idx];
    sl_unheap(st, idx);
    st->by_ssid[s->ssid] = -1;
    s->held = 0;
    sl_emit(st, SL_EVICT, idx, s->seq);
}

/* Whether session idx's packets go to the reply r's source address and port. */
static int sl_peer(struct sl_state *st, int idx, const struct recv_rec *r)
{
    const uint8_t *sa = st->arena + (size_t)idx * SL_REC + 24;
    sa_family_t family;
    memcpy(&family, sa, sizeof(family));
    uint16_t port = (uint16_t)(sa[2] << 8 | sa[3]);
    if (port != r->sport)
        return 0;
    if (family == AF_INET)
        return (r->flags & 2) && !memcmp(sa + 4, r->src, 4);
    const uint8_t *a = sa + 8; /* sin6_addr */
    if (!memcmp(a, mapped, 12))
        return (r->flags & 2) && !memcmp(a + 12, r->src, 4);
    return !(r->flags & 2) && !memcmp(a, r->src, 16);
}

/* Whether held session idx claims reply r by its source, Seq and T1 alone
 * (SenderSession.claims): r comes from the session's reflector address and port, and
 * its sender Seq is outstanding with exactly the T1 it echoes. */
static int sl_claims(struct sl_state *st, int idx, const struct recv_rec *r)
{
    struct sl_sess *s = &st->sess[idx];
    if (!s->held)
        return 0;
    const struct sl_slot *w = &s->win[r->sseq & s->mask];
    int64_t t1;
    return w->deadline != SL_NONE && w->seq == r->sseq && sl_peer(st, idx, r)
        && !utc(r->ts[0], r->see & Z_BIT, s->tai, &t1) && t1 == w->t1;
}

/* A plain reply r with SSID 0, an RFC 8762-only reflector's (RFC 8972 §3), arrived at
 * monotonic now (docs/stamp-interop.md, "Sessions and SSIDs"). Only the held sessions
 * that claim it (sl_claims) are concerned: it cannot be another's, on the loop or on
 * the engine's path. When the one session that claims it has had a reply with its own
 * SSID (an RFC 8972 reflector never answers it with 0), the reply is a stray, counted
 * as the core counts it (an SL_SSID_ZERO_STRAY drop, its packet still outstanding):
 * 1. Otherwise every claimant without such a reply leaves the loop (SL_EVICT), so that
 * the engine matches the reply with their whole state, and the reply is left: 0 (none
 * claims it: the engine's sessions may; else it counts no_session). 2 when the out
 * records lack the room (the reply waits; left, with no eviction, when even empty out
 * records could not hold them: so many claimants leave it to no session anyway). A
 * reply whose T1 no packet outstanding has (st->t1s, by its bucket) is nobody's in the
 * loop at once: only an echo of a real T1 costs a pass over the held sessions. */
static int sl_zero(struct sl_state *st, const struct recv_rec *r, int64_t now)
{
    int64_t wire_t1;
    if (utc(r->ts[0], r->see & Z_BIT, 0, &wire_t1) || !st->t1s[sl_t1(wire_t1)])
        return 0; /* no packet outstanding has its T1: nobody claims it, no scan */
    int n = 0, evict = 0, first = -1;
    for (int j = 0; j < st->cap; j++) {
        if (sl_claims(st, j, r)) {
            n++;
            evict += !st->sess[j].echoed;
            first = j;
        }
    }
    if (n == 1 && !evict) {
        if (st->n_out + (int)st->sess[first].mask + 3 > st->out_cap)
            return 2;
        sl_expire(st, first, now);
        sl_emit(st, SL_DROP, first, r->sseq)->rseq = SL_SSID_ZERO_STRAY;
        return 1;
    }
    if (st->n_out + evict > st->out_cap)
        return st->n_out ? 2 : 0;
    for (int j = 0; evict && j < st->cap; j++) {
        if (!st->sess[j].echoed && sl_claims(st, j, r)) {
            sl_evict(st, j);
            evict--;
        }
    }
    return 0;
}

/* Read replies until the socket is empty (mutex held). Each one with a held session's
 * SSID is answered or dropped here (sl_reply), and a stray with SSID 0 (sl_zero);
 * every other one is left for the engine, in arrival order, at the start of the
 * receive buffers (n_left): one longer than 44 bytes that answers a packet of a held
 * session takes that session out of the loop first (sl_reply), and one with SSID 0
 * the held sessions that claim it (sl_zero), so that the engine answers every reply
 * the loop leaves with the session's whole state. 0; 1 when some are left (the loop
 * receives no more until sl_left_done); 2 when the out records have no room for the
 * next reply's (it and those after it wait in the buffers for the next call);
 * -errno. */
static int sl_receive(struct sl_state *st, int fd)
{
    for (;;) {
        if (st->rx_next >= st->rx_got) {
            int got = pio_recv(fd, st->data, st->slot, MAX_BATCH, st->recs);
            if (got <= 0)
                return got;
            st->received += got;
            st->rx_got = got;
            st->rx_next = 0;
            st->rx_mono = clock_ns(CLOCK_MONOTONIC);
            st->rx_wall = clock_ns(CLOCK_REALTIME);
        }
        int64_t mono = st->rx_mono, wall = st->rx_wall;
        for (int i = st->rx_next; i < st->rx_got; i++) {
            const struct recv_rec *r = &st->recs[i];
            int plain = r->len >= 44 && !(r->flags & 1); /* decoded by pio_recv */
            int idx = plain ? st->by_ssid[r->ssid] : -1;
            int zero = plain && r->ssid == 0;
            /* room for the reply's records: its losses (the window) and one more, or
             * an eviction; sl_zero sees to its own */
            int room = idx >= 0 ? (int)st->sess[idx].mask + 3 : 1;
            if (st->n_out + room > st->out_cap) {
                st->rx_next = i;
                return 2;
            }
            int64_t t4 = r->t4 ? r->t4 : wall;
            int64_t now = t4 < wall ? mono - wall + t4 : mono;
            if (idx >= 0 && !sl_reply(st, idx, r, now, t4, r->len == 44))
                continue;
            if (zero) {
                int rc = sl_zero(st, r, now);
                if (rc == 2) {
                    st->rx_next = i;
                    return 2;
                }
                if (rc == 1)
                    continue;
            }
            int k = st->left_at++;
            if (k != i) {
                memmove(st->data + (size_t)k * (size_t)st->slot,
                        st->data + (size_t)i * (size_t)st->slot,
                        r->len < (uint32_t)st->slot ? r->len : (size_t)st->slot);
                st->recs[k] = *r;
            }
        }
        int whole = st->rx_got == MAX_BATCH, left = st->left_at;
        st->rx_next = st->rx_got = st->left_at = 0;
        if (left) {
            st->n_left = st->left_new = left;
            return 1;
        }
        if (!whole)
            return 0;
    }
}

/* Run the loop until monotonic ns until, or until the waker fd is readable; a run at
 * most once per tick ns, replies read at each run and, while no run is due within hold
 * ns, whenever they come. With notify < 0 it also returns when replies are left for the
 * engine or the out records are (nearly) full. With notify >= 0 (the loop on a thread
 * of its own) it writes a byte to notify then and goes on: sending, but receiving no
 * more until sl_left_done, nothing at all while the out records are full; a byte on
 * resume (drained here) makes it look again (sl_left_done, sl_take, sl_add done).
 * Which of those ended it (SL_* bits); -errno on a socket error. */
int sl_run(struct sl_state *st, int fd, int waker, int notify, int resume, int64_t until,
           int64_t tick, int64_t hold)
{
    int read_now = 1, told = 0;
    for (;;) {
        int64_t now = clock_ns(CLOCK_MONOTONIC);
        pthread_mutex_lock(&st->mu);
        int rc = 0, left = st->n_left;
        if (left && notify < 0) { /* the engine has not taken the last ones yet */
            pthread_mutex_unlock(&st->mu);
            return SL_SOCKET;
        }
        int full = st->n_out + 2 * MAX_BATCH > st->out_cap;
        int due = st->heap_n && st->sess[st->heap[0]].due <= now && now - st->last_run >= tick;
        if (!left && !full && (read_now || due || st->rx_next < st->rx_got))
            rc = sl_receive(st, fd);
        if (rc >= 0 && rc != 2 && due && !full) {
            sl_pass(st, fd, now);
            st->last_run = now;
        }
        full = full || rc == 2 || st->n_out + 2 * MAX_BATCH > st->out_cap;
        left = st->n_left;
        int64_t next = until;
        if (st->heap_n) {
            int64_t slot = st->sess[st->heap[0]].due, after = st->last_run + tick;
            slot = slot > after ? slot : after;
            next = slot < until ? slot : until;
        }
        int pending = st->heap_n;
        pthread_mutex_unlock(&st->mu);
        if (rc < 0)
            return rc;
        if (notify < 0) {
            if (rc == 1)
                return SL_SOCKET;
            if (full)
                return SL_FULL;
        } else if ((left || full) && !told) {
            ssize_t w = write(notify, "x", 1); /* full pipe: the engine is told already */
            (void)w;
            told = 1;
        }
        read_now = 0;
        now = clock_ns(CLOCK_MONOTONIC);
        if (now >= until)
            return SL_UNTIL;
        int64_t wait = full ? until - now : next - now;
        if (wait <= 0)
            continue;
        int watch = !left && !full && (!pending || wait > hold);
        struct pollfd fds[3] = {{waker, POLLIN, 0}, {resume, POLLIN, 0}, {fd, POLLIN, 0}};
        if (resume < 0) {
            fds[1] = fds[2];
            fds[2].fd = -1;
        }
        int n = (resume < 0 ? 1 : 2) + watch;
        struct timespec ts = {wait / (int64_t)NS, wait % (int64_t)NS};
        int r = ppoll(fds, (nfds_t)n, &ts, NULL);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (fds[0].revents)
            return SL_WAKER;
        if (resume >= 0 && fds[1].revents) {
            char buf[64];
            while (read(resume, buf, sizeof(buf)) > 0)
                ;
            told = 0;
        }
        if (watch && fds[n - 1].revents)
            read_now = 1;
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
