/*
 * stampgen: offer UDP frames (STAMP Session-Sender, ILNP echo requests) at a fixed
 * rate from one CPU.
 *
 * Built and run by sixlab.bench.generator (see its docstring for why C and why
 * sendmmsg on an AF_PACKET socket with PACKET_QDISC_BYPASS).
 *
 *   stampgen IFNAME FRAME_HEX RATE_PPS SECONDS BATCH TICK_US
 *
 * FRAME_HEX is a whole Ethernet frame (Ethernet + IPv6 + UDP + payload, e.g. STAMP)
 * with a valid UDP checksum. Hop-by-Hop, Routing and Destination Options headers may
 * sit between IPv6 and UDP (an ILNPv6 frame carries its nonce in a Destination Options
 * header, RFC 6744): the UDP header is found by walking them (RFC 8200 section 4).
 * Each frame sent carries the next sequence number in the first 4 bytes of the UDP
 * payload (STAMP's Sequence Number, RFC 8762 section 4.2.1); the UDP checksum is
 * updated for it with RFC 1624 eqn. 3, which needs only the checksum already in the
 * frame, whatever pseudo-header it was computed over (the ILNP NID-only one too,
 * RFC 6740 section 6.3). Pacing: at every step the number of frames due is
 * floor(RATE * elapsed) - offered; up to BATCH of them go out in one sendmmsg(2), and
 * the loop spins on CLOCK_MONOTONIC (vDSO, no system call) when none is due. With
 * TICK_US > 0, sends happen only every TICK_US microseconds (what is due then goes out
 * back to back, like a NIC's interrupt coalescing delivers it); 0 sends as soon as due.
 *
 * The socket is blocking, so a full send buffer waits (generator-side backpressure,
 * never counted as loss). With the qdisc bypassed, the only error a veth send gives
 * is ENOBUFS: the peer's input backlog (the SUT's receive queue) was full and the
 * frame was dropped there. Such a frame was offered and lost: it counts in
 * "offered" and "input_drops". sendmmsg(2) loses the error of a message that fails
 * after others were sent, so the message at the short count is taken as that drop.
 *
 * Prints one JSON object: offered, sent, input_drops, elapsed_s, calls.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_FRAME 2048
#define MAX_BATCH 256
/* Ethernet (14) + IPv6 (40): where the first header after IPv6 starts. */
#define ETH_IPV6_LEN 54
/* At most this many extension headers before UDP (a sanity bound, not a protocol one). */
#define MAX_EXT_HEADERS 8
/* The UDP header's offset in the frame (udp_offset), its checksum at +6, payload at +8. */
static size_t csum_off, seq_off;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* RFC 1624 eqn. 3 for one 16-bit word: HC' = ~(~HC + ~m + m'). */
static uint16_t csum_update(uint16_t hc, uint16_t old, uint16_t new_) {
    uint32_t sum = (uint16_t)~hc + (uint16_t)~old + new_;
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    uint16_t out = (uint16_t)~sum;
    return out == 0 ? 0xffff : out; /* UDP sends a computed zero as 0xFFFF (RFC 768) */
}

static uint16_t get16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }

static void set_seq(uint8_t *frame, uint32_t seq) {
    uint16_t csum = get16(frame + csum_off);
    uint16_t hi = (uint16_t)(seq >> 16), lo = (uint16_t)seq;
    csum = csum_update(csum, get16(frame + seq_off), hi);
    csum = csum_update(csum, get16(frame + seq_off + 2), lo);
    put16(frame + seq_off, hi);
    put16(frame + seq_off + 2, lo);
    put16(frame + csum_off, csum);
}

/*
 * Offset of the UDP header in an Ethernet + IPv6 frame of len bytes, skipping
 * Hop-by-Hop (0), Routing (43) and Destination Options (60) headers, whose length is
 * (Hdr Ext Len + 1) * 8 bytes (RFC 8200 section 4.3, 4.4, 4.6); 0 if there is no UDP
 * header (or no room for it and 4 payload bytes).
 */
static size_t udp_offset(const uint8_t *frame, size_t len) {
    if (len < ETH_IPV6_LEN || get16(frame + 12) != ETH_P_IPV6) return 0;
    uint8_t next = frame[14 + 6];
    size_t off = ETH_IPV6_LEN;
    for (int i = 0; i < MAX_EXT_HEADERS && (next == 0 || next == 43 || next == 60); i++) {
        if (off + 2 > len) return 0;
        next = frame[off];
        off += ((size_t)frame[off + 1] + 1) * 8;
    }
    if (next != 17 || off + 8 + 4 > len) return 0;
    return off;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s IFNAME FRAME_HEX RATE_PPS SECONDS BATCH TICK_US\n", argv[0]);
        return 2;
    }
    const char *ifname = argv[1];
    const char *hex = argv[2];
    double rate = atof(argv[3]);
    double seconds = atof(argv[4]);
    int batch = atoi(argv[5]);
    double tick = atof(argv[6]) * 1e-6;
    size_t len = strlen(hex) / 2;
    if (len < ETH_IPV6_LEN + 8 + 4 || len > MAX_FRAME || strlen(hex) % 2 || rate <= 0 ||
        seconds <= 0 || batch < 1 || batch > MAX_BATCH || tick < 0) {
        fprintf(stderr, "stampgen: bad arguments\n");
        return 2;
    }
    static uint8_t frames[MAX_BATCH][MAX_FRAME];
    for (size_t i = 0; i < len; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            fprintf(stderr, "stampgen: bad frame hex\n");
            return 2;
        }
        frames[0][i] = (uint8_t)(hi << 4 | lo);
    }
    size_t udp = udp_offset(frames[0], len);
    if (udp == 0) {
        fprintf(stderr, "stampgen: frame is not Ethernet + IPv6 [+ extension headers] + UDP\n");
        return 2;
    }
    csum_off = udp + 6;
    seq_off = udp + 8;
    for (int b = 1; b < batch; b++) memcpy(frames[b], frames[0], len);

    int fd = socket(AF_PACKET, SOCK_RAW, 0);
    if (fd < 0) { perror("socket"); return 1; }
    int one = 1, sndbuf = 4 << 20;
    if (setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof one) < 0)
        perror("PACKET_QDISC_BYPASS"); /* not fatal: the qdisc path works, slower */
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    struct sockaddr_ll sll;
    memset(&sll, 0, sizeof sll);
    sll.sll_family = AF_PACKET;
    sll.sll_protocol = htons(ETH_P_IPV6);
    sll.sll_ifindex = (int)if_nametoindex(ifname);
    if (sll.sll_ifindex == 0) { perror(ifname); return 1; }
    if (bind(fd, (struct sockaddr *)&sll, sizeof sll) < 0) { perror("bind"); return 1; }

    static struct mmsghdr msgs[MAX_BATCH];
    static struct iovec iov[MAX_BATCH];
    for (int b = 0; b < batch; b++) {
        iov[b].iov_base = frames[b];
        iov[b].iov_len = len;
        memset(&msgs[b], 0, sizeof msgs[b]);
        msgs[b].msg_hdr.msg_iov = &iov[b];
        msgs[b].msg_hdr.msg_iovlen = 1;
    }

    uint64_t offered = 0, sent = 0, drops = 0, calls = 0;
    uint32_t seq = 0;
    double start = now_s(), end = start + seconds, t = start, next_tick = start;
    while ((t = now_s()) < end) {
        if (t < next_tick) continue;
        uint64_t due = (uint64_t)(rate * (t - start));
        if (due <= offered) continue;
        if (tick > 0) next_tick = t + tick;
        /* All that is due, BATCH frames per system call (and never past the end). */
        while (offered < due && now_s() < end) {
            int n = (int)((due - offered) < (uint64_t)batch ? (due - offered) : (uint64_t)batch);
            for (int b = 0; b < n; b++) set_seq(frames[b], seq + (uint32_t)b);
            int done = 0;
            while (done < n) {
                int r = sendmmsg(fd, msgs + done, (unsigned)(n - done), 0);
                calls++;
                if (r < 0) {
                    if (errno == ENOBUFS) { drops++; offered++; done++; continue; }
                    if (errno == EINTR) continue;
                    perror("sendmmsg");
                    return 1;
                }
                sent += (uint64_t)r;
                offered += (uint64_t)r;
                done += r;
                if (done < n) { drops++; offered++; done++; } /* the message at the short count */
            }
            seq += (uint32_t)n;
        }
    }
    double elapsed = now_s() - start;
    printf("{\"offered\": %llu, \"sent\": %llu, \"input_drops\": %llu, \"elapsed_s\": %.6f, "
           "\"calls\": %llu}\n",
           (unsigned long long)offered, (unsigned long long)sent,
           (unsigned long long)drops, elapsed, (unsigned long long)calls);
    return 0;
}
