// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * ILNPv6 kernel fast path for established correspondents (tc, both directions).
 *
 * The ILNP host daemon (sixlab.ilnp.daemon) keeps the ILCC in Python and moves every
 * packet itself: TUN -> host -> raw socket out, ring -> host -> TUN in (~12 us a
 * packet). Once an ILCC entry is established its per-packet work is a fixed rewrite,
 * so the daemon mirrors the entry into `ilnp_peers` and these two programs do it:
 *
 *  - ilnp_egress (tc egress of the TUN device): an application's packet on identifier
 *    addresses (prefix|our NID -> prefix|peer NID), TCP or UDP, for a peer with a
 *    ready entry: the Destination Options header with our nonce (RFC 6744) is inserted
 *    when the entry says so, the addresses become locator|NID (RFC 6740 I-LVs), an
 *    Ethernet header is pushed and bpf_redirect_neigh() sends it out of the interface
 *    that holds the local locator, to the next hop the daemon read from that
 *    interface's routes (the neighbour table fills in L2).
 *  - ilnp_ingress (tc ingress of each ILNP link): a packet for our NID on one of our
 *    locators, TCP or UDP, from a peer with a ready entry, carrying exactly the peer's
 *    nonce (or none, where the entry allows that) from a locator of the peer's set
 *    whose lifetime (plus grace) has not run out: the option is removed, the addresses
 *    become identifier addresses and the packet is redirected into the TUN device's
 *    receive path, so the kernel delivers it to the application's socket.
 *
 * The transport checksum of a packet is not touched in either direction: the
 * identifier prefix's four 16-bit words add up to 0xFFFF (ones' complement zero), so
 * the checksum over identifier addresses is the NID-only ILNP checksum (RFC 6740 §6.3).
 * A TCP aggregate that the link's GRO made is the exception (ilnp_ingress; docs/
 * ilnp-field.md, "Segments coalesced by the link").
 *
 * That holds for a checksum not finished yet too. TCP hands every segment to the
 * device CHECKSUM_PARTIAL: the check field holds the pseudo-header sum (over identifier
 * addresses, so the NID-only one) and csum_start/csum_offset say where the device is
 * to finish it. Neither inserting the nonce option (bpf_skb_adjust_room moves the
 * headers in front of the transport header, not the transport header) nor pushing the
 * Ethernet header moves csum_start, so whoever finishes the sum - the link's NIC, or
 * the stack in software when the link has no checksum offload - writes the NID-only
 * checksum. Between namespaces a veth finishes nothing: the packet reaches the peer
 * unfinished, as plain TCP between namespaces does, the peer's kernel trusts it and a
 * packet socket sees TP_STATUS_CSUMNOTREADY (the ILNP daemon finishes those itself).
 * UDP on a TUN without offloads is summed in full by the stack.
 *
 * Anything else goes on unchanged (TC_ACT_OK) to the daemon's user-space path, which
 * stays the one place where admission, Locator Updates, ICMP, unknown or malformed
 * packets and every drop reason are handled and counted: the fast path never drops a
 * packet the slow path would have accepted, and never accepts one it would refuse.
 * Each fast-path decision is counted per CPU (enum fp_counter); a packet the programs
 * started to rewrite and could not finish is dropped and counted (FP_*_ERROR).
 *
 * Liveness: the Python ILCC needs to know an entry is in use (LRU order, idle expiry)
 * and that its peer is still heard (a restarted peer is told apart by that), so the
 * programs push the peer's NID into the `ilnp_activity` ring buffer at most once a
 * second per entry and direction; the daemon drains it.
 *
 * Time is CLOCK_MONOTONIC (bpf_ktime_get_ns), the clock the daemon's `now` comes from.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define ETH_HLEN 14
#define ETH_P_IPV6 0x86DD
#define NH_DSTOPTS 60
#define NH_TCP 6
#define NH_UDP 17
#define OPT_NONCE 0x8B   /* RFC 6744 §3: the ILNP Nonce option */
#define IP6_HLEN 40
#define MAX_LOCATORS 8
#define ACTIVITY_EVERY_NS 1000000000ULL
/* Bytes of a frame the parser reads: Ethernet, IPv6, a 16-byte Destination Options. */
#define PULL_LEN (ETH_HLEN + IP6_HLEN + 16)

/* ilnp_peer.flags, set by the daemon from the entry (sixlab.ilnp.fastpath). */
#define F_EGRESS 0x1         /* send to this peer from the kernel */
#define F_INGRESS 0x2        /* accept from this peer in the kernel */
#define F_CARRY_NONCE 0x4    /* insert our nonce on egress */
#define F_NONCE_OPTIONAL 0x8 /* accept packets without the peer's nonce */

struct ilnp_config {
	__u64 nid;    /* our NID, host order; 0 = fast path off */
	__u64 prefix; /* the identifier prefix (upper 64 bits), host order */
	__u64 locators[MAX_LOCATORS]; /* our locators: a packet's destination must be one */
	__u32 n_locators;
	__u32 tun_ifindex;
};

struct ilnp_peer {
	__u64 local_locator;   /* egress: our source locator */
	__u64 peer_locator;    /* egress: the peer's best locator */
	__u64 egress_until_ns; /* egress only before this time; then user space decides */
	__u64 accept[MAX_LOCATORS];          /* ingress: the peer's locators ... */
	__u64 accept_until_ns[MAX_LOCATORS]; /* ... each accepted before this time */
	__u64 last_report_ns;    /* written here: last activity report (egress) ... */
	__u64 last_rx_report_ns; /* ... and last one for a packet from the peer */
	__u32 egress_ifindex;
	__u32 flags;
	__u8 local_nonce_len; /* 4 or 12 (RFC 6744) */
	__u8 peer_nonce_len;
	__u8 n_accept;
	__u8 pad0[5];
	__u8 local_nonce[12];
	__u8 peer_nonce[12];
	__u8 next_hop[16]; /* egress: the next hop on egress_ifindex; zero: look it up */
};

enum fp_counter {
	FP_RX_FAST = 0,
	FP_RX_NO_PEER = 1,    /* unknown NID: admission happens in user space */
	FP_RX_NOT_READY = 2,  /* entry not ready for the kernel (state, nonce unknown) */
	FP_RX_NONCE = 3,      /* nonce missing, different or laid out otherwise */
	FP_RX_LOCATOR = 4,    /* source locator not (or no longer) in the peer's set */
	FP_RX_PROTOCOL = 5,   /* not TCP or UDP (ICMPv6, Locator Updates, ...) */
	FP_RX_GSO = 6,        /* GRO aggregate other than TCP, or over 64 KiB */
	FP_RX_ERROR = 7,      /* rewrite failed half way: dropped */
	FP_TX_FAST = 8,
	FP_TX_NO_PEER = 9,
	FP_TX_NOT_READY = 10,
	FP_TX_EXPIRED = 11,   /* the chosen locator's lifetime ran out: user space re-picks */
	FP_TX_PROTOCOL = 12,  /* not TCP or UDP (ICMPv6, ...) */
	FP_TX_GSO = 13,       /* TCP segmentation offload packet */
	FP_TX_NO_ROOM = 14,   /* the nonce did not fit (TUN MTU): user space sends it */
	FP_TX_ERROR = 15,
	FP_RX_LOCAL = 16,     /* our NID on a locator that is not ours */
	FP_ACTIVITY_LOST = 17, /* activity ring buffer full */
	FP_RX_NO_ROOM = 18,   /* bpf_skb_adjust_room refused to remove the option */
	FP_RX_FAST_TCP = 19,  /* of FP_RX_FAST, TCP */
	FP_TX_FAST_TCP = 20,  /* of FP_TX_FAST, TCP */
	FP_RX_FAST_GSO = 21,  /* of FP_RX_FAST_TCP, GRO aggregates */
	FP_MAX = 22,
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ilnp_config);
} ilnp_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64); /* peer NID, host order */
	__type(value, struct ilnp_peer);
} ilnp_peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FP_MAX);
	__type(key, __u32);
	__type(value, __u64);
} ilnp_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 << 10);
} ilnp_activity SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&ilnp_counters, &which);
	if (c)
		*c += 1;
}

static __always_inline __u64 load64(const void *p)
{
	return bpf_be64_to_cpu(*(const __u64 *)p);
}

/* One activity report: the peer, and whether a packet came *from* it (ingress), which
 * also tells the host the peer's session is alive (sixlab.ilnp.host, restart_grace). */
struct activity {
	__u64 nid;
	__u64 heard;
};

static __always_inline void report(struct ilnp_peer *peer, __u64 nid, __u64 now, int heard)
{
	__u64 *last = heard ? &peer->last_rx_report_ns : &peer->last_report_ns;
	if (now - *last < ACTIVITY_EVERY_NS)
		return;
	*last = now;
	struct activity sample = {.nid = nid, .heard = heard};
	if (bpf_ringbuf_output(&ilnp_activity, &sample, sizeof(sample), 0))
		count(FP_ACTIVITY_LOST);
}

/* The rewritten fixed header from offset 4: payload length, next header, hop limit,
 * source and destination address, all in network order; 36 bytes, no padding. */
struct ip6_tail {
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__be64 src_hi, src_lo, dst_hi, dst_lo;
} __attribute__((packed));
_Static_assert(sizeof(struct ip6_tail) == 36, "ip6_tail must match the IPv6 header");

static __always_inline int our_locator(const struct ilnp_config *cfg, __u64 loc)
{
	for (int i = 0; i < MAX_LOCATORS; i++)
		if (i < cfg->n_locators && cfg->locators[i] == loc)
			return 1;
	return 0;
}

static __always_inline int peer_locator_ok(const struct ilnp_peer *peer, __u64 loc, __u64 now)
{
	for (int i = 0; i < MAX_LOCATORS; i++)
		if (i < peer->n_accept && peer->accept[i] == loc && now < peer->accept_until_ns[i])
			return 1;
	return 0;
}

SEC("tc")
int ilnp_ingress(struct __sk_buff *skb)
{
	if (skb->protocol != bpf_htons(ETH_P_IPV6))
		return TC_ACT_OK;
	__u32 zero = 0;
	struct ilnp_config *cfg = bpf_map_lookup_elem(&ilnp_cfg, &zero);
	if (!cfg || !cfg->nid)
		return TC_ACT_OK;
	__u32 want = skb->len < PULL_LEN ? skb->len : PULL_LEN;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	if (data + want > end) {
		if (bpf_skb_pull_data(skb, want))
			return TC_ACT_OK;
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
	}
	struct ipv6hdr *ip6 = data + ETH_HLEN;
	if ((void *)(ip6 + 1) > end)
		return TC_ACT_OK;
	if (load64(&ip6->daddr.in6_u.u6_addr8[8]) != cfg->nid)
		return TC_ACT_OK; /* not ours: not counted, the link carries other traffic */
	if (!our_locator(cfg, load64(&ip6->daddr.in6_u.u6_addr8[0]))) {
		count(FP_RX_LOCAL);
		return TC_ACT_OK;
	}
	__u64 src_loc = load64(&ip6->saddr.in6_u.u6_addr8[0]);
	__u64 peer_nid = load64(&ip6->saddr.in6_u.u6_addr8[8]);
	struct ilnp_peer *peer = bpf_map_lookup_elem(&ilnp_peers, &peer_nid);
	if (!peer) {
		count(FP_RX_NO_PEER);
		return TC_ACT_OK;
	}
	if (!(peer->flags & F_INGRESS)) {
		count(FP_RX_NOT_READY);
		return TC_ACT_OK;
	}
	__u8 nh = ip6->nexthdr;
	__s32 optlen = 0;
	if (nh == NH_DSTOPTS) {
		/* Exactly what RFC 6744 senders (and sixlab.wire.ilnp) write: the nonce option
		 * alone, filling the header. Any other layout is left to user space. */
		__u8 *o = (void *)(ip6 + 1);
		if ((void *)(o + 8) > end || o[2] != OPT_NONCE) {
			count(FP_RX_NONCE);
			return TC_ACT_OK;
		}
		if (peer->peer_nonce_len == 4 && o[1] == 0 && o[3] == 4) {
			if (*(__u32 *)(o + 4) != *(__u32 *)peer->peer_nonce) {
				count(FP_RX_NONCE);
				return TC_ACT_OK;
			}
			optlen = 8;
		} else if (peer->peer_nonce_len == 12 && o[1] == 1 && o[3] == 12 &&
			   (void *)(o + 16) <= end) {
			if (*(__u32 *)(o + 4) != *(__u32 *)peer->peer_nonce ||
			    *(__u64 *)(o + 8) != *(__u64 *)(peer->peer_nonce + 4)) {
				count(FP_RX_NONCE);
				return TC_ACT_OK;
			}
			optlen = 16;
		} else {
			count(FP_RX_NONCE);
			return TC_ACT_OK;
		}
		nh = o[0];
	} else if (!(peer->flags & F_NONCE_OPTIONAL)) {
		count(FP_RX_NONCE);
		return TC_ACT_OK;
	}
	if (nh != NH_TCP && nh != NH_UDP) {
		count(FP_RX_PROTOCOL);
		return TC_ACT_OK;
	}
	__u64 now = bpf_ktime_get_ns();
	if (!peer_locator_ok(peer, src_loc, now)) {
		count(FP_RX_LOCATOR);
		return TC_ACT_OK;
	}
	/* A GRO aggregate (gso_size set): TCP only, and within the 16-bit payload length
	 * (BIG TCP's larger ones say 0 there). UDP aggregates (GRO fraglist, UDP_GRO
	 * sockets) are left to the daemon, whose ring takes them whole or counts them. */
	int gso = skb->gso_size != 0;
	if (gso && (nh != NH_TCP || !ip6->payload_len)) {
		count(FP_RX_GSO);
		return TC_ACT_OK;
	}
	/* GRO finished the aggregate's TCP header as the kernel does for a segment it will
	 * cut again (tcp6_gro_complete): CHECKSUM_PARTIAL, the check field holding the
	 * pseudo-header sum over the addresses on the wire, locator|NID. The NIDs stay; the
	 * locators become the identifier prefix: the difference goes into that sum
	 * (bpf_l4_csum_replace with BPF_F_PSEUDO_HDR updates a partial checksum's
	 * pseudo-header part), so the sum is the one over identifier addresses again. A
	 * single segment's checksum is left alone: a sender's, it already is. */
	__u64 wire_locs[2] = {*(__u64 *)&ip6->saddr, *(__u64 *)&ip6->daddr}; /* as on the wire */
	struct ip6_tail tail = {
		.payload_len = bpf_htons(bpf_ntohs(ip6->payload_len) - optlen),
		.nexthdr = nh,
		.hop_limit = ip6->hop_limit,
		.src_hi = bpf_cpu_to_be64(cfg->prefix),
		.src_lo = bpf_cpu_to_be64(peer_nid),
		.dst_hi = bpf_cpu_to_be64(cfg->prefix),
		.dst_lo = bpf_cpu_to_be64(cfg->nid),
	};
	/* FIXED_GSO: the aggregate's segment size stays the sender's MSS (by default the
	 * helper would grow it by the bytes removed). */
	if (optlen && bpf_skb_adjust_room(skb, -optlen, BPF_ADJ_ROOM_NET, BPF_F_ADJ_ROOM_FIXED_GSO)) {
		count(FP_RX_NO_ROOM); /* nothing changed yet: user space takes it */
		return TC_ACT_OK;
	}
	if (bpf_skb_store_bytes(skb, ETH_HLEN + 4, &tail, sizeof(tail), BPF_F_RECOMPUTE_CSUM)) {
		count(FP_RX_ERROR);
		return TC_ACT_SHOT;
	}
	if (gso) {
		__u64 id_locs[2] = {tail.src_hi, tail.dst_hi};
		__s64 diff = bpf_csum_diff((__be32 *)wire_locs, sizeof(wire_locs), (__be32 *)id_locs,
					   sizeof(id_locs), 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, ETH_HLEN + IP6_HLEN + 16, 0, (__u32)diff,
						    BPF_F_PSEUDO_HDR)) {
			count(FP_RX_ERROR);
			return TC_ACT_SHOT;
		}
	}
	report(peer, peer_nid, now, 1);
	count(FP_RX_FAST);
	if (nh == NH_TCP)
		count(FP_RX_FAST_TCP);
	if (gso)
		count(FP_RX_FAST_GSO);
	return bpf_redirect(cfg->tun_ifindex, BPF_F_INGRESS);
}

SEC("tc")
int ilnp_egress(struct __sk_buff *skb)
{
	if (skb->protocol != bpf_htons(ETH_P_IPV6))
		return TC_ACT_OK;
	__u32 zero = 0;
	struct ilnp_config *cfg = bpf_map_lookup_elem(&ilnp_cfg, &zero);
	if (!cfg || !cfg->nid)
		return TC_ACT_OK;
	/* A TUN device has no link layer: the IPv6 header is at offset 0. */
	__u32 want = skb->len < IP6_HLEN ? skb->len : IP6_HLEN;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	if (data + want > end) {
		if (bpf_skb_pull_data(skb, want))
			return TC_ACT_OK;
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
	}
	struct ipv6hdr *ip6 = data;
	if ((void *)(ip6 + 1) > end)
		return TC_ACT_OK;
	if (load64(&ip6->saddr.in6_u.u6_addr8[0]) != cfg->prefix ||
	    load64(&ip6->saddr.in6_u.u6_addr8[8]) != cfg->nid ||
	    load64(&ip6->daddr.in6_u.u6_addr8[0]) != cfg->prefix)
		return TC_ACT_OK; /* not an identifier-address packet of ours */
	__u64 peer_nid = load64(&ip6->daddr.in6_u.u6_addr8[8]);
	struct ilnp_peer *peer = bpf_map_lookup_elem(&ilnp_peers, &peer_nid);
	if (!peer) {
		count(FP_TX_NO_PEER);
		return TC_ACT_OK;
	}
	if (!(peer->flags & F_EGRESS)) {
		count(FP_TX_NOT_READY);
		return TC_ACT_OK;
	}
	__u64 now = bpf_ktime_get_ns();
	if (now >= peer->egress_until_ns) {
		count(FP_TX_EXPIRED);
		return TC_ACT_OK;
	}
	__u8 nh = ip6->nexthdr;
	if (nh != NH_UDP && nh != NH_TCP) {
		count(FP_TX_PROTOCOL);
		return TC_ACT_OK;
	}
	/* A segmentation offload packet is left to user space: the TUN device (no TSO)
	 * cuts it into segments on its way to the daemon. The daemon caps the device's
	 * gso_max_segs at 1 while the fast path runs, so TCP builds none. */
	if (skb->gso_segs > 1) {
		count(FP_TX_GSO);
		return TC_ACT_OK;
	}
	__s32 optlen = 0;
	if (peer->flags & F_CARRY_NONCE)
		optlen = peer->local_nonce_len == 12 ? 16 : 8;
	struct ip6_tail tail = {
		.payload_len = bpf_htons(bpf_ntohs(ip6->payload_len) + optlen),
		.nexthdr = optlen ? NH_DSTOPTS : nh,
		.hop_limit = ip6->hop_limit,
		.src_hi = bpf_cpu_to_be64(peer->local_locator),
		.src_lo = bpf_cpu_to_be64(cfg->nid),
		.dst_hi = bpf_cpu_to_be64(peer->peer_locator),
		.dst_lo = bpf_cpu_to_be64(peer_nid),
	};
	if (optlen) {
		/* The room check is against the TUN's MTU: a full-size packet does not fit
		 * and is left to user space, which sends it on the link (larger MTU). */
		if (bpf_skb_adjust_room(skb, optlen, BPF_ADJ_ROOM_NET, 0)) {
			count(FP_TX_NO_ROOM);
			return TC_ACT_OK;
		}
		__u8 opt[16] = {nh, optlen / 8 - 1, OPT_NONCE, peer->local_nonce_len};
		__builtin_memcpy(opt + 4, peer->local_nonce, 12);
		int err = optlen == 16 ? bpf_skb_store_bytes(skb, IP6_HLEN, opt, 16, 0)
				       : bpf_skb_store_bytes(skb, IP6_HLEN, opt, 8, 0);
		if (err) {
			count(FP_TX_ERROR);
			return TC_ACT_SHOT;
		}
	}
	if (bpf_skb_store_bytes(skb, 4, &tail, sizeof(tail), 0) ||
	    /* bpf_redirect_neigh() wants a link-layer header to replace: push a blank one. */
	    bpf_skb_change_head(skb, ETH_HLEN, 0)) {
		count(FP_TX_ERROR);
		return TC_ACT_SHOT;
	}
	report(peer, peer_nid, now, 0);
	count(FP_TX_FAST);
	if (nh == NH_TCP)
		count(FP_TX_FAST_TCP);
	/* The next hop is the daemon's, from the routes through egress_ifindex: the
	 * helper's own lookup takes the host's preferred route, whichever link it goes
	 * through, and looks for its gateway on egress_ifindex, where it never answers. */
	struct bpf_redir_neigh hop = {.nh_family = 10 /* AF_INET6 */};
	__builtin_memcpy(hop.ipv6_nh, peer->next_hop, 16);
	if (hop.ipv6_nh[0] | hop.ipv6_nh[1] | hop.ipv6_nh[2] | hop.ipv6_nh[3])
		return bpf_redirect_neigh(peer->egress_ifindex, &hop, sizeof(hop), 0);
	return bpf_redirect_neigh(peer->egress_ifindex, NULL, 0, 0);
}
