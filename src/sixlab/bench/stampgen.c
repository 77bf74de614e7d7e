/*
 * stampgen: offer UDP frames (STAMP Session-Sender, ILNP echo requests) at a fixed
 * rate from one CPU.
 *
 * Built and run by sixlab.bench.generator (see its docstring for why C and why
 * sendmmsg on an AF_PACKET socket with PACKET_QDISC_BYPASS).
 *
 *   stampgen IFNAME FRAME_HEX RATE_PPS SECONDS BATCH TICK_US [MIX_HEX SHARE [OFF:BASE ...]]
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
 * Mixed traffic: with MIX_HEX and SHARE (0..1), a second frame makes up that share of
 * the frames, spread evenly through the stream (frame n is a MIX frame when
 * floor((n + 1) * SHARE) exceeds the MIX frames offered before it), as a tester mixes
 * two streams on one port. Each kind counts its own frames from 0. By default a MIX
 * frame's first 4 payload bytes get its own count, like the main frame's; OFF:BASE
 * arguments replace that: for each, the 32-bit big-endian field at UDP payload offset
 * OFF gets BASE + count (mod 2^32), the checksum updated the same way. (A STAMP
 * Session-Reflector packet answering Session-Sender Seq k with T1 = T + k seconds:
 * "24:0" and "28:<NTP seconds of T>", RFC 8762 section 4.3.1.)
 *
 * Prints one JSON object: offered, sent, input_drops, elapsed_s, calls, and with a MIX
 * frame mix_offered and mix_input_drops (included in offered and input_drops).
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
/* At most this many counter fields per frame (OFF:BASE arguments). */
#define MAX_PATCH 8

/* One kind of frame: BATCH copies (one per message of a sendmmsg call) and its fields. */
struct kind {
    uint8_t (*frames)[MAX_FRAME];
    size_t len;
    size_t csum_off;                /* the UDP checksum (UDP header + 6) */
    size_t payload_off;             /* the UDP payload (UDP header + 8) */
    int npatch;
    size_t patch_off[MAX_PATCH];    /* counter fields, from the UDP payload */
    uint32_t patch_base[MAX_PATCH];
    uint64_t offered, drops;
};

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

/* Write BASE + count into every counter field of one copy, checksum updated. */
static void set_count(const struct kind *k, uint8_t *frame, uint32_t count) {
    uint16_t csum = get16(frame + k->csum_off);
    for (int i = 0; i < k->npatch; i++) {
        uint8_t *field = frame + k->payload_off + k->patch_off[i];
        uint32_t value = k->patch_base[i] + count;
        uint16_t hi = (uint16_t)(value >> 16), lo = (uint16_t)value;
        csum = csum_update(csum, get16(field), hi);
        csum = csum_update(csum, get16(field + 2), lo);
        put16(field, hi);
        put16(field + 2, lo);
    }
    put16(frame + k->csum_off, csum);
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

/* Parse FRAME_HEX into k->frames[0], find its UDP header; 0 on success. */
static int load_frame(struct kind *k, const char *hex, int batch) {
    size_t len = strlen(hex) / 2;
    if (strlen(hex) % 2 || len < ETH_IPV6_LEN + 8 + 4 || len > MAX_FRAME) return -1;
    for (size_t i = 0; i < len; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        k->frames[0][i] = (uint8_t)(hi << 4 | lo);
    }
    size_t udp = udp_offset(k->frames[0], len);
    if (udp == 0) return -1;
    k->len = len;
    k->csum_off = udp + 6;
    k->payload_off = udp + 8;
    k->npatch = 1; /* the first 4 payload bytes, from 0, unless OFF:BASE say otherwise */
    k->patch_off[0] = 0;
    k->patch_base[0] = 0;
    for (int b = 1; b < batch; b++) memcpy(k->frames[b], k->frames[0], len);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 7 || argc == 8) {
        fprintf(stderr,
                "usage: %s IFNAME FRAME_HEX RATE_PPS SECONDS BATCH TICK_US "
                "[MIX_HEX SHARE [OFF:BASE ...]]\n",
                argv[0]);
        return 2;
    }
    const char *ifname = argv[1];
    double rate = atof(argv[3]);
    double seconds = atof(argv[4]);
    int batch = atoi(argv[5]);
    double tick = atof(argv[6]) * 1e-6;
    double share = argc > 8 ? atof(argv[8]) : 0.0;
    if (rate <= 0 || seconds <= 0 || batch < 1 || batch > MAX_BATCH || tick < 0 ||
        share < 0 || share > 1) {
        fprintf(stderr, "stampgen: bad arguments\n");
        return 2;
    }
    static uint8_t main_frames[MAX_BATCH][MAX_FRAME], mix_frames[MAX_BATCH][MAX_FRAME];
    struct kind kinds[2] = {{.frames = main_frames}, {.frames = mix_frames}};
    if (load_frame(&kinds[0], argv[2], batch) != 0) {
        fprintf(stderr, "stampgen: frame is not Ethernet + IPv6 [+ extension headers] + UDP\n");
        return 2;
    }
    int mixing = argc > 8;
    if (mixing) {
        struct kind *m = &kinds[1];
        if (load_frame(m, argv[7], batch) != 0) {
            fprintf(stderr, "stampgen: mix frame is not Ethernet + IPv6 [+ ext. headers] + UDP\n");
            return 2;
        }
        if (argc > 9) {
            if (argc - 9 > MAX_PATCH) {
                fprintf(stderr, "stampgen: at most %d OFF:BASE fields\n", MAX_PATCH);
                return 2;
            }
            m->npatch = 0;
            for (int a = 9; a < argc; a++) {
                char *colon = strchr(argv[a], ':');
                size_t off = colon ? strtoul(argv[a], NULL, 10) : 0;
                if (!colon || m->payload_off + off + 4 > m->len) {
                    fprintf(stderr, "stampgen: bad field %s\n", argv[a]);
                    return 2;
                }
                m->patch_off[m->npatch] = off;
                m->patch_base[m->npatch] = (uint32_t)strtoul(colon + 1, NULL, 10);
                m->npatch++;
            }
        }
    }

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
    static int kind_of[MAX_BATCH];
    for (int b = 0; b < batch; b++) {
        memset(&msgs[b], 0, sizeof msgs[b]);
        msgs[b].msg_hdr.msg_iov = &iov[b];
        msgs[b].msg_hdr.msg_iovlen = 1;
    }

    uint64_t offered = 0, sent = 0, drops = 0, calls = 0;
    /* Frames of each kind given a slot so far (offered or about to be). */
    uint64_t chosen = 0, chosen_mix = 0;
    double start = now_s(), end = start + seconds, t = start, next_tick = start;
    while ((t = now_s()) < end) {
        if (t < next_tick) continue;
        uint64_t due = (uint64_t)(rate * (t - start));
        if (due <= offered) continue;
        if (tick > 0) next_tick = t + tick;
        /* All that is due, BATCH frames per system call (and never past the end). */
        while (offered < due && now_s() < end) {
            int n = (int)((due - offered) < (uint64_t)batch ? (due - offered) : (uint64_t)batch);
            for (int b = 0; b < n; b++) {
                int k = mixing && (uint64_t)((double)(chosen + 1) * share) > chosen_mix;
                struct kind *kd = &kinds[k];
                set_count(kd, kd->frames[b], (uint32_t)(k ? chosen_mix : chosen - chosen_mix));
                iov[b].iov_base = kd->frames[b];
                iov[b].iov_len = kd->len;
                kind_of[b] = k;
                chosen++;
                chosen_mix += (uint64_t)k;
            }
            int done = 0;
            while (done < n) {
                int r = sendmmsg(fd, msgs + done, (unsigned)(n - done), 0);
                calls++;
                if (r < 0) {
                    if (errno == ENOBUFS) {
                        kinds[kind_of[done]].drops++;
                        kinds[kind_of[done]].offered++;
                        drops++; offered++; done++;
                        continue;
                    }
                    if (errno == EINTR) continue;
                    perror("sendmmsg");
                    return 1;
                }
                for (int b = done; b < done + r; b++) kinds[kind_of[b]].offered++;
                sent += (uint64_t)r;
                offered += (uint64_t)r;
                done += r;
                if (done < n) { /* the message at the short count */
                    kinds[kind_of[done]].drops++;
                    kinds[kind_of[done]].offered++;
                    drops++; offered++; done++;
                }
            }
        }
    }
    double elapsed = now_s() - start;
    printf("{\"offered\": %llu, \"sent\": %llu, \"input_drops\": %llu, \"elapsed_s\": %.6f, "
           "\"calls\": %llu",
           (unsigned long long)offered, (unsigned long long)sent,
           (unsigned long long)drops, elapsed, (unsigned long long)calls);
    if (mixing)
        printf(", \"mix_offered\": %llu, \"mix_input_drops\": %llu",
               (unsigned long long)kinds[1].offered, (unsigned long long)kinds[1].drops);
    printf("}\n");
    return 0;
}
