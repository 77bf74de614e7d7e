/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Shared by stamp_reflector.bpf.c and stamp_collector.bpf.c: the map layouts that the
 * Python side (sixlab.dataplane.xdp_plane) mirrors with ctypes structures, the counter
 * reasons, the header parser, the UDP checksum sums and the timestamp conversions.
 *
 * Every struct here is laid out with explicit padding so that the C and the ctypes
 * sides agree byte for byte (no compiler-inserted holes).
 */
#ifndef SIXLAB_STAMP_COMMON_H
#define SIXLAB_STAMP_COMMON_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ETH_P_IPV6 0x86DD
#define NH_ROUTING 43
#define NH_UDP 17
#define SRH_TYPE 4 /* RFC 8754 §2: Routing Type 4 */

/* RFC 8762 §4.2-4.3 base packet sizes, and the least a sender packet holds (§4.6). */
#define STAMP_UNAUTH_SIZE 44
#define STAMP_AUTH_SIZE 112
#define STAMP_MIN_SIZE 14
/* Return SID lists longer than this are answered by the user-space path. */
#define STAMP_MAX_SEGS 8
/* TLVs walked in the kernel; an area with more goes to user space. */
#define STAMP_MAX_TLVS 8
/* Largest UDP datagram (header included) handled in XDP: one 1500-byte MTU frame. */
#define STAMP_MAX_UDP 1460
/* Session key of the SSID-agnostic default session: outside the 16-bit SSID space. */
#define STAMP_DEFAULT_SSID 0x10000
/* Counter key of packets that belong to no session. */
#define STAMP_NO_SSID 0xFFFFFFFF
#define NS_PER_S 1000000000ULL
/* Seconds from 1900-01-01 (NTP epoch) to 1970-01-01 (RFC 868). */
#define NTP_UNIX_OFFSET_S 2208988800ULL

enum stamp_fmt { STAMP_FMT_NTP = 0, STAMP_FMT_PTP = 1 };
enum stamp_mode { STAMP_STATELESS = 0, STAMP_STATEFUL = 1 };

/* Why a packet for the STAMP port was handled the way it was (counter keys). */
enum stamp_reason {
	R_REFLECTED = 0,       /* answered with XDP_TX */
	R_COLLECTED = 1,       /* collector: record pushed, packet consumed */
	R_PASS_AUTH = 2,       /* authenticated session: user space verifies the HMAC */
	R_PASS_NO_SESSION = 3, /* no session and no default: user space decides */
	R_PASS_TLV = 4,        /* TLVs other than Extra Padding: user space fills them */
	R_PASS_SHORT = 5,      /* 14..43 bytes: user space answers with a full base packet */
	R_PASS_BIG = 6,        /* larger than STAMP_MAX_UDP */
	R_DROP_TOO_SHORT = 7,  /* under 14 bytes (RFC 8762 §4.6) */
	R_DROP_MULT_ZERO = 8,  /* Error Estimate Multiplier 0 (RFC 4656 §4.1.2) */
	R_DROP_MALFORMED = 9,  /* UDP/IPv6 lengths disagree with the frame */
	R_DROP_ADJUST = 10,    /* bpf_xdp_adjust_head refused the resize */
	R_PASS_RINGBUF = 11,   /* collector: ring buffer full, user space gets it */
	R_PASS_CSUM = 12,      /* UDP checksum 0: invalid over IPv6, the kernel drops it */
	R_PASS_BAD_CSUM = 13,  /* UDP checksum does not verify: the kernel decides */
	R_PASS_FLOWS = 14,     /* stateful: no room in the flow table, user space answers */
	R_MAX = 15,
};

struct stamp_config {
	__u16 port;       /* host order: the local STAMP port */
	__u8 hop_limit;   /* Hop Limit of the replies */
	/* 1: the reflector's session map holds no session but the default one, so the SSID
	 * lookups (a hash miss each, ~30 ns) are skipped; 0: look the SSID up. The agent
	 * clears it before it writes an SSID session and sets it once the last one is gone. */
	__u8 default_only;
	__u32 pad1;
	__s64 tai_minus_utc_ns; /* CLOCK_TAI - CLOCK_REALTIME as measured by the agent */
};

struct stamp_session {
	__u8 mode;  /* enum stamp_mode */
	__u8 fmt;   /* enum stamp_fmt */
	__u8 auth;  /* 1: authenticated, handled by the user-space path */
	__u8 nsegs; /* return SIDs in segs, 0: plain return */
	__u16 ee;   /* Error Estimate of the replies, host order */
	__u16 pad0;
	__u32 next_seq; /* unused: stateful counters are per flow (stamp_flow_key) */
	__u32 gen;      /* generation: the agent writes a new one whenever it adds the session */
	__s64 ptp_offset_ns; /* TAI - UTC for PTP timestamps, as the Python core adds it */
	__u8 segs[STAMP_MAX_SEGS][16]; /* return path in WIRE order: segs[0] = last visited */
};

/* A STAMP session is the SSID with the addresses and ports (RFC 8972 §3): a stateful
 * session's reply Seq is counted per flow. ``session`` is the session-map key (an SSID or
 * STAMP_DEFAULT_SSID), ``ssid`` the packet's own SSID (the default session serves many),
 * ``gen`` the session's generation, so that a session added again starts from 0. */
struct stamp_flow_key {
	__u32 session;
	__u32 ssid;
	__u32 gen;
	__u16 sport, dport; /* network order, as on the wire */
	__u8 saddr[16];
	__u8 daddr[16];
};

struct stamp_counter_key {
	__u32 ssid; /* SSID, STAMP_DEFAULT_SSID or STAMP_NO_SSID */
	__u32 reason;
};

/* One reflected packet seen by the collector; timestamps raw as on the wire. */
struct stamp_record {
	__u64 t4_tai_ns;
	__u64 t1, t2, t3;
	__u32 seq;       /* Session-Sender Seq echoed by the reflector */
	__u32 rseq;      /* the reflector's own Seq */
	__u16 ssid;
	__u16 sender_ee;
	__u16 reflector_ee;
	__u8 ttl;
	__u8 hop_limit;  /* Hop Limit the reply arrived with */
	__u16 sport;     /* host order */
	__u16 dport;
	__u32 pad;
	__u8 src[16];
	__u8 dst[16];
};

struct srh_fixed {
	__u8 nexthdr;
	__u8 hdrlen;
	__u8 type;
	__u8 segments_left;
	__u8 last_entry;
	__u8 flags;
	__u16 tag;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stamp_config);
} stamp_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct stamp_counter_key);
	__type(value, __u64);
} stamp_counters SEC(".maps");

static __always_inline void count(__u32 ssid, __u32 reason)
{
	struct stamp_counter_key key = { .ssid = ssid, .reason = reason };
	__u64 *v = bpf_map_lookup_elem(&stamp_counters, &key);
	if (v) {
		*v += 1; /* per-CPU value: no atomics needed */
		return;
	}
	__u64 one = 1;
	bpf_map_update_elem(&stamp_counters, &key, &one, BPF_NOEXIST);
}

/* Where the UDP header of a STAMP packet for port `port` sits, or NULL to XDP_PASS. */
struct parsed {
	struct ethhdr *eth;
	struct ipv6hdr *ip6;
	struct udphdr *udp;
	__u32 srh_len; /* bytes of the SRH, 0 if none */
};

static __always_inline int parse(struct xdp_md *ctx, __u16 port, struct parsed *p)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IPV6))
		return 0;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	if ((void *)(ip6 + 1) > end)
		return 0;
	__u8 nh = ip6->nexthdr;
	void *l4 = ip6 + 1;
	__u32 srh_len = 0;
	if (nh == NH_ROUTING) {
		struct srh_fixed *srh = l4;
		if ((void *)(srh + 1) > end)
			return 0;
		/* Only an SRH at its last segment is for this node; anything else (another
		 * routing type, a packet still in transit) is the kernel's business. */
		if (srh->type != SRH_TYPE || srh->segments_left != 0)
			return 0;
		if (2 * ((__u32)srh->last_entry + 1) > srh->hdrlen)
			return 0;
		srh_len = ((__u32)srh->hdrlen + 1) * 8;
		nh = srh->nexthdr;
		l4 = (void *)srh + srh_len;
	}
	if (nh != NH_UDP)
		return 0;
	struct udphdr *udp = l4;
	if ((void *)(udp + 1) > end)
		return 0;
	if (udp->dest != bpf_htons(port))
		return 0;
	p->eth = eth;
	p->ip6 = ip6;
	p->udp = udp;
	p->srh_len = srh_len;
	return 1;
}

/*
 * The Internet checksum (RFC 1071) of UDP over IPv6 (RFC 8200 §8.1, RFC 768).
 *
 * Sums are kept in a 64-bit accumulator of 32-bit words loaded in host order: the
 * ones'-complement sum of 16-bit words is byte-order independent (RFC 1071 §2(B)) and
 * carries can be deferred (§2(C)), so folding the accumulator to 16 bits at the end gives
 * the same sum, in host order, as the word-by-word definition.
 */
static __always_inline __u16 fold(__u64 sum)
{
	sum = (sum & 0xFFFF) + (sum >> 16);
	sum = (sum & 0xFFFF) + (sum >> 16);
	sum = (sum & 0xFFFF) + (sum >> 16);
	return (__u16)sum;
}

static __always_inline __u64 sum_addr(const __u8 *a)
{
	const __u32 *w = (const __u32 *)a;
	return (__u64)w[0] + w[1] + w[2] + w[3];
}

/* `sum` plus the bytes from w to the end of the frame, which must be at most
 * STAMP_MAX_UDP bytes: the callers have checked that the UDP datagram ends the frame and
 * is no larger.
 * Eight bytes per step: the two 32-bit halves of each 64-bit load are added to the
 * accumulator (at most 183 steps of less than 2^33: no overflow); then the 4-, 2- and
 * 1-byte tail. */
static __always_inline __u64 sum_to_end(__u64 sum, __u8 *w, void *end)
{
	for (int i = 0; i < STAMP_MAX_UDP / 8; i++) {
		/* Keep w in one register so the bounds check covers the load. */
		asm volatile("" : "+r"(w));
		if ((void *)(w + 8) > end)
			break;
		__u64 x = *(__u64 *)w;
		sum += (x & 0xFFFFFFFF) + (x >> 32);
		w += 8;
	}
	if ((void *)(w + 4) <= end) {
		sum += *(__u32 *)w;
		w += 4;
	}
	if ((void *)(w + 2) <= end) {
		sum += *(__u16 *)w;
		w += 2;
	}
	if ((void *)(w + 1) <= end)
		sum += *w; /* odd length: the last byte padded with zero (network order) */
	return sum;
}

/* The UDP pseudo-header (RFC 8200 §8.1): source, final destination, Upper-Layer Packet
 * Length (the UDP Length), Next Header 17; in the same host order as sum_to_end. */
static __always_inline __u64 sum_pseudo(const __u8 *src, const __u8 *dst, __u32 ulen)
{
	return sum_addr(src) + sum_addr(dst) + bpf_htonl(ulen) + bpf_htonl(NH_UDP);
}

/*
 * Whether the UDP checksum of the received datagram at `udp_off` bytes into the frame
 * verifies: the sum of the pseudo-header and of the whole datagram, its Checksum field
 * included, is 0xFFFF (ones'-complement zero; RFC 1071 §1). The datagram must end the
 * frame and hold at most STAMP_MAX_UDP bytes (else: 0, not verified), and the IPv6
 * Destination Address be the final one: parse() only lets an SRH at Segments Left 0
 * through, where the Destination Address is already the last segment.
 *
 * A zero Checksum field (never valid over IPv6) is the caller's to reject first: it
 * verifies here when the true checksum is 0xFFFF, its ones'-complement twin.
 *
 * What does not verify is either damaged or was never finished: a frame sent by a local
 * socket through a device with tx checksum offload (a veth by default) can still hold
 * only the pseudo-header sum (CHECKSUM_PARTIAL), which XDP cannot tell from damage.
 * Both go on to the kernel (XDP_PASS), which drops the first (Udp6InCsumErrors) and
 * delivers the second.
 *
 * A global function (not inlined, not static) on purpose: the verifier checks it once,
 * on its own, with the context as its only pointer. Inlined, the summing loop's ~180
 * exits would each leave the caller's packet pointers with another proven range (every
 * step's bound check widens the range of all pointers derived from the same base), no
 * exit state would prune another, and the rest of the reflector would be verified once
 * per exit: over the verifier's 1M-instruction budget (so it went on 6.18; as a global
 * function the reflector takes 502k, against 491k without any verification). The price
 * is one BPF-to-BPF call and the bound checks below, made again on the context's
 * pointers.
 */
__attribute__((noinline)) int stamp_udp6_csum_ok(struct xdp_md *ctx, __u32 udp_off)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
	if ((void *)(ip6 + 1) > end)
		return 0;
	/* Bounded for the verifier: Ethernet, IPv6 and the largest SRH (RFC 8754 §2). */
	if (udp_off > sizeof(struct ethhdr) + sizeof(struct ipv6hdr) + 8 * 256)
		return 0;
	struct udphdr *udp = data + udp_off;
	if ((void *)(udp + 1) > end)
		return 0;
	__u32 ulen = bpf_ntohs(udp->len);
	if (ulen > STAMP_MAX_UDP || (void *)udp + ulen != end)
		return 0;
	__u64 sum = sum_pseudo((const __u8 *)&ip6->saddr, (const __u8 *)&ip6->daddr, ulen);
	return fold(sum_to_end(sum, (__u8 *)udp, end)) == 0xFFFF;
}

/* The offset of p's UDP header in the frame, for stamp_udp6_csum_ok. */
static __always_inline __u32 udp_offset(const struct parsed *p)
{
	return sizeof(struct ethhdr) + sizeof(struct ipv6hdr) + p->srh_len;
}

static __always_inline __u64 ntp_from_ns(__u64 utc_ns)
{
	__u64 sec = utc_ns / NS_PER_S;
	__u64 nsec = utc_ns - sec * NS_PER_S; /* a multiply: cheaper than a second division */
	/* nsec * 2^32 / 10^9 rounded to nearest (nsec < 2^30: no overflow, no carry). */
	__u64 frac = ((nsec << 32) + NS_PER_S / 2) / NS_PER_S;
	return (((sec + NTP_UNIX_OFFSET_S) & 0xFFFFFFFFULL) << 32) | frac;
}

static __always_inline __u64 ptp_from_ns(__u64 tai_ns)
{
	__u64 sec = tai_ns / NS_PER_S;
	return (sec << 32) | (tai_ns - sec * NS_PER_S);
}

#endif
