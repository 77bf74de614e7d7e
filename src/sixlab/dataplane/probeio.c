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

/* Send n records of buf; *t1 gets the wall time written into them. Returns the number
 * of packets the kernel refused (each one skipped, the rest still sent); *err the errno
 * of the last refusal. */
int pio_send(int fd, uint8_t *buf, int n, const uint32_t *seqs, int64_t *t1, int *err)
{
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    struct timespec now;
    if (n > MAX_BATCH)
        n = MAX_BATCH;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t wall = (int64_t)now.tv_sec * (int64_t)NS + now.tv_nsec;
    *t1 = wall;
    *err = 0;
    size_t off = 0;
    memset(msgs, 0, sizeof(msgs[0]) * (size_t)n);
    for (int i = 0; i < n; i++) {
        uint8_t *rec = buf + off;
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
        put_be(payload, seqs[i], 4);
        put_be(payload + 4, stamp, 8);
        iov[i].iov_base = payload;
        iov[i].iov_len = plen;
        msgs[i].msg_hdr.msg_name = rec + 24;
        msgs[i].msg_hdr.msg_namelen = alen;
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        off += SEND_HEAD + ((plen + 7) & ~7U);
    }
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
