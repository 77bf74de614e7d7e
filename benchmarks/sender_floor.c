/* The compiled floor of bench_sender.py: what a sender engine with no interpreter in
 * its loop costs on this kernel for the same probes at the same rate and tick.
 *
 *   sender_floor PORT PPS TICK_US WARMUP_S SECONDS SESSIONS
 *
 * One UDP socket on [::]:0 with the socket plane's options (SO_TIMESTAMPNS,
 * IPV6_RECVHOPLIMIT, IPV6_RECVPKTINFO, IPV6_RECVTCLASS, a 4 MiB receive buffer). Every
 * tick (CLOCK_MONOTONIC, absolute sleeps, at least 1/PPS) it sends the probes whose
 * slots (k / PPS after the start) have passed in sendmmsg(2) batches of up to 256, each
 * an RFC 8762 §4.2.1 unauthenticated Session-Sender packet of 44 bytes, SSID 1 + k mod
 * SESSIONS, Seq k, Timestamp one CLOCK_REALTIME reading per batch as NTP (RFC 5905 §6);
 * then it drains the socket with recvmmsg(2) of up to 256, reads the control messages
 * (kernel receive time, Hop Limit, Traffic Class, packet info) and the RFC 8762 §4.3.1
 * fields of each reply, and matches it to its session by SSID, Seq and the echoed T1
 * (a table of the last T1 sent per session). That is the I/O and the least per-probe
 * work of the engine's C path (src/sixlab/dataplane/probeio.c) without Python.
 *
 * Prints one line of JSON over the window after the warm-up: probes sent, replies
 * received and matched, the process's user and system time (getrusage), wake-ups, and
 * each probe's slip (send time less its slot) p50 / p99 / max.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#define BATCH 256
#define PROBE 44
#define SLOT 9000
#define CMSG_BYTES 256
#define NS 1000000000LL
#define NTP_UNIX_OFFSET_S 2208988800ULL
#define SLIP_BUCKETS 200000 /* 1 µs each: up to 200 ms */

static uint8_t out[BATCH][PROBE];
static uint8_t in[BATCH][SLOT];
static uint8_t control[BATCH][CMSG_BYTES];
static uint64_t slip_hist[SLIP_BUCKETS + 1];

static int64_t clock_ns(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (int64_t)t.tv_sec * NS + t.tv_nsec;
}

static double cpu_s(const struct timeval *tv)
{
    return (double)tv->tv_sec + (double)tv->tv_usec / 1e6;
}

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

static int64_t slip_pct(uint64_t total, double p)
{
    uint64_t want = (uint64_t)((double)total * p / 100.0 + 0.999999), seen = 0;
    for (int i = 0; i <= SLIP_BUCKETS; i++) {
        seen += slip_hist[i];
        if (seen >= want && want)
            return i;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: %s PORT PPS TICK_US WARMUP_S SECONDS SESSIONS\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]);
    double pps = atof(argv[2]), tick_us = atof(argv[3]);
    double warmup = atof(argv[4]), seconds = atof(argv[5]);
    int sessions = atoi(argv[6]);
    if (port <= 0 || pps <= 0 || sessions <= 0 || sessions > 65535) {
        fprintf(stderr, "sender_floor: bad arguments\n");
        return 2;
    }
    int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    int one = 1, rcvbuf = 4 << 20;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one))
        || setsockopt(fd, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, &one, sizeof(one))
        || setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof(one))
        || setsockopt(fd, IPPROTO_IPV6, IPV6_RECVTCLASS, &one, sizeof(one))
        || setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf))) {
        perror("sender_floor: socket");
        return 1;
    }
    struct sockaddr_in6 local = {.sin6_family = AF_INET6};
    if (bind(fd, (struct sockaddr *)&local, sizeof(local))) {
        perror("sender_floor: bind");
        return 1;
    }
    struct sockaddr_in6 dst = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
    dst.sin6_addr = in6addr_loopback;
    uint64_t *last_t1 = calloc((size_t)sessions, sizeof(uint64_t));
    uint32_t *last_seq = calloc((size_t)sessions, sizeof(uint32_t));
    static struct mmsghdr smsg[BATCH], rmsg[BATCH];
    static struct iovec siov[BATCH], riov[BATCH];
    static struct sockaddr_in6 names[BATCH];
    for (int i = 0; i < BATCH; i++) {
        memset(out[i], 0, PROBE);
        put_be(out[i] + 12, 1, 2); /* Error Estimate: S 0, Z 0 (NTP), Scale 0, Multiplier 1 */
        siov[i] = (struct iovec){out[i], PROBE};
        smsg[i].msg_hdr.msg_name = &dst;
        smsg[i].msg_hdr.msg_namelen = sizeof(dst);
        smsg[i].msg_hdr.msg_iov = &siov[i];
        smsg[i].msg_hdr.msg_iovlen = 1;
        riov[i] = (struct iovec){in[i], SLOT};
    }
    int64_t tick = (int64_t)(tick_us * 1e3);
    if (tick < (int64_t)(1e9 / pps))
        tick = (int64_t)(1e9 / pps);
    int64_t begin = clock_ns(CLOCK_MONOTONIC);
    int64_t window = begin + (int64_t)(warmup * 1e9);
    int64_t end = window + (int64_t)(seconds * 1e9);
    uint64_t sent = 0, sent0 = 0, received = 0, received0 = 0, matched = 0, matched0 = 0;
    uint64_t wakeups = 0, wakeups0 = 0, refused = 0, measured = 0, slip_max = 0;
    struct rusage r0 = {0}, r1;
    int64_t w0 = 0, now;
    int measuring = 0;
    while ((now = clock_ns(CLOCK_MONOTONIC)) < end) {
        wakeups++;
        if (!measuring && now >= window) {
            measuring = 1;
            getrusage(RUSAGE_SELF, &r0);
            w0 = now;
            sent0 = sent, received0 = received, matched0 = matched, wakeups0 = wakeups;
        }
        uint64_t due = (uint64_t)((double)(now - begin) * pps / 1e9);
        while (sent < due) {
            int n = due - sent > BATCH ? BATCH : (int)(due - sent);
            int64_t wall = clock_ns(CLOCK_REALTIME);
            uint64_t stamp = ntp_from_ns(wall);
            for (int i = 0; i < n; i++) {
                uint64_t k = sent + (uint64_t)i;
                int s = (int)(k % (uint64_t)sessions);
                put_be(out[i], (uint32_t)k, 4);
                put_be(out[i] + 4, stamp, 8);
                put_be(out[i] + 14, (uint64_t)(1 + s), 2);
                last_t1[s] = stamp;
                last_seq[s] = (uint32_t)k;
            }
            int done = 0;
            while (done < n) {
                int r = sendmmsg(fd, smsg + done, (unsigned)(n - done), MSG_DONTWAIT);
                if (r < 0) {
                    if (errno == EINTR)
                        continue;
                    refused++;
                    done++;
                } else {
                    done += r;
                }
            }
            if (measuring) {
                int64_t after = clock_ns(CLOCK_MONOTONIC);
                for (int i = 0; i < n; i++) {
                    int64_t slot = begin + (int64_t)((double)(sent + (uint64_t)i) * 1e9 / pps);
                    uint64_t us = after > slot ? (uint64_t)(after - slot) / 1000 : 0;
                    slip_max = us > slip_max ? us : slip_max;
                    slip_hist[us < SLIP_BUCKETS ? us : SLIP_BUCKETS]++;
                    measured++;
                }
            }
            sent += (uint64_t)n;
        }
        for (;;) {
            for (int i = 0; i < BATCH; i++) {
                struct msghdr *h = &rmsg[i].msg_hdr;
                h->msg_name = &names[i];
                h->msg_namelen = sizeof(names[i]);
                h->msg_iov = &riov[i];
                h->msg_iovlen = 1;
                h->msg_control = control[i];
                h->msg_controllen = CMSG_BYTES;
                h->msg_flags = 0;
            }
            int got = recvmmsg(fd, rmsg, BATCH, MSG_DONTWAIT, NULL);
            if (got <= 0)
                break;
            received += (uint64_t)got;
            for (int i = 0; i < got; i++) {
                struct msghdr *h = &rmsg[i].msg_hdr;
                int64_t t4 = 0;
                int hop = 0, tclass = -1;
                struct in6_pktinfo info;
                for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c; c = CMSG_NXTHDR(h, c)) {
                    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPNS) {
                        struct timespec ts;
                        memcpy(&ts, CMSG_DATA(c), sizeof(ts));
                        t4 = (int64_t)ts.tv_sec * NS + ts.tv_nsec;
                    } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_HOPLIMIT) {
                        memcpy(&hop, CMSG_DATA(c), sizeof(hop));
                    } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS) {
                        memcpy(&tclass, CMSG_DATA(c), sizeof(tclass));
                    } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
                        memcpy(&info, CMSG_DATA(c), sizeof(info));
                    }
                }
                const uint8_t *p = in[i];
                if (rmsg[i].msg_len < PROBE || !t4 || hop < 0 || tclass > 255)
                    continue;
                uint32_t ssid = (uint32_t)get_be(p + 14, 2);
                uint32_t sseq = (uint32_t)get_be(p + 24, 4);
                uint64_t t1 = get_be(p + 28, 8);
                if (ssid >= 1 && ssid <= (uint32_t)sessions && last_seq[ssid - 1] == sseq
                    && last_t1[ssid - 1] == t1)
                    matched++;
            }
            if (got < BATCH)
                break;
        }
        int64_t next = begin + ((now - begin) / tick + 1) * tick;
        struct timespec at = {(time_t)(next / NS), (long)(next % NS)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR)
            ;
    }
    getrusage(RUSAGE_SELF, &r1);
    double span = (double)(clock_ns(CLOCK_MONOTONIC) - w0) / 1e9;
    double user = cpu_s(&r1.ru_utime) - cpu_s(&r0.ru_utime);
    double sys = cpu_s(&r1.ru_stime) - cpu_s(&r0.ru_stime);
    uint64_t n = sent - sent0 ? sent - sent0 : 1;
    printf("{\"sent\": %llu, \"received\": %llu, \"matched\": %llu, \"refused\": %llu, "
           "\"wakeups\": %llu, \"span_s\": %.6f, \"user_s\": %.6f, \"system_s\": %.6f, "
           "\"slip_us_p50\": %lld, \"slip_us_p99\": %lld, \"slip_us_max\": %llu}\n",
           (unsigned long long)n, (unsigned long long)(received - received0),
           (unsigned long long)(matched - matched0), (unsigned long long)refused,
           (unsigned long long)(wakeups - wakeups0), span, user, sys,
           (long long)slip_pct(measured, 50), (long long)slip_pct(measured, 99),
           (unsigned long long)slip_max);
    return 0;
}
