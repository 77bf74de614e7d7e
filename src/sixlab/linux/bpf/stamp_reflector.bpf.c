// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * STAMP Session-Reflector in XDP (RFC 8762 §4.3, RFC 8972 §3, SRv6 return paths).
 *
 * For an unauthenticated Session-Sender packet to the configured port whose SSID names
 * an active session (or the default one), the reply is built in place and sent with
 * XDP_TX:
 *
 *   1. T2 = bpf_ktime_get_tai_ns() as soon as the headers show the STAMP port;
 *   2. the received Hop Limit is kept for Ses-Sender TTL before any header is touched;
 *   3. the sender fields are moved to their reflector offsets, Seq is the sender's
 *      (stateless) or the flow's own counter from 0 (stateful, an atomic add; a session
 *      is the SSID with the addresses and ports, RFC 8972 §3: stamp_flows);
 *   4. Extra Padding TLVs are copied with U cleared (symmetric size, RFC 8972 §4.1);
 *   5. the Ethernet, IPv6 and SRH headers are rewritten: MACs, addresses and ports
 *      swapped, the SRH replaced by the session's return SID list closed by the
 *      sender's address (bpf_xdp_adjust_head grows or shrinks the head);
 *   6. T3 = a second clock reading, then the UDP checksum over the final destination
 *      (RFC 8200 §8.1), then XDP_TX.
 *
 * Before step 3, once a session is found, the received UDP checksum is verified
 * (stamp_udp6_csum_ok): a packet damaged on the way is never answered, but passed on to the
 * kernel, whose UDP layer drops it (Udp6InCsumErrors).
 *
 * Everything the kernel program does not handle goes on to the kernel untouched
 * (XDP_PASS), where the agent's user-space path (a UDP socket on the same port) answers
 * it with the Python core: authenticated packets (HMAC-SHA-256 has no place in XDP), and
 * unauthenticated ones whose SSID names an authenticated session (the core refuses them),
 * TLVs other than Extra Padding, packets shorter than the base packet (answered with a
 * full one, RFC 8762 §4.6), packets without a session. Packets that no path may answer
 * (too short, Multiplier 0, lengths that disagree) are dropped and counted.
 */
#include "stamp_common.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct stamp_session);
} stamp_sessions SEC(".maps");

/* Stateful reply counters, per flow (struct stamp_flow_key); the least recently used
 * flow makes room, as the Python core forgets its oldest (sixlab.stamp.reflector). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct stamp_flow_key);
	__type(value, __u32);
} stamp_flows SEC(".maps");

/* Replies sent, per session (index: SSID, or STAMP_DEFAULT_SSID), per CPU. The rarer
 * outcomes are counted in stamp_counters. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAMP_DEFAULT_SSID + 1);
	__type(key, __u32);
	__type(value, __u64);
} stamp_reflected SEC(".maps");

static __always_inline __u64 stamp_ts(__u64 tai_ns, const struct stamp_config *cfg,
				      const struct stamp_session *s)
{
	__u64 utc = tai_ns - (__u64)cfg->tai_minus_utc_ns;
	if (s->fmt == STAMP_FMT_PTP)
		return ptp_from_ns(utc + (__u64)s->ptp_offset_ns);
	return ntp_from_ns(utc);
}

static __always_inline int same_addr(const __u8 *a, const __u8 *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

SEC("xdp")
int stamp_reflector(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct stamp_config *cfg = bpf_map_lookup_elem(&stamp_cfg, &zero);
	if (!cfg || !cfg->port)
		return XDP_PASS;
	struct parsed p;
	if (!parse(ctx, cfg->port, &p))
		return XDP_PASS;
	/* T2: read as soon as the packet is known to be for the STAMP port, so that
	 * traffic that is not STAMP never pays for a clock read. */
	__u64 t2_raw = bpf_ktime_get_tai_ns();
	void *end = (void *)(long)ctx->data_end;
	struct udphdr *udp = p.udp;
	__u32 ulen = bpf_ntohs(udp->len);
	__u32 plen_ip = bpf_ntohs(p.ip6->payload_len);
	if (ulen < 8 || plen_ip != p.srh_len + ulen || (void *)udp + ulen != end) {
		count(STAMP_NO_SSID, R_DROP_MALFORMED);
		return XDP_DROP;
	}
	if (udp->check == 0) {
		count(STAMP_NO_SSID, R_PASS_CSUM);
		return XDP_PASS;
	}
	__u32 plen = ulen - 8;
	__u8 *pl = (void *)(udp + 1);
	if (plen < STAMP_MIN_SIZE) {
		count(STAMP_NO_SSID, R_DROP_TOO_SHORT);
		return XDP_DROP;
	}
	if (plen < STAMP_UNAUTH_SIZE) {
		count(STAMP_NO_SSID, R_PASS_SHORT);
		return XDP_PASS;
	}
	if (ulen > STAMP_MAX_UDP) {
		count(STAMP_NO_SSID, R_PASS_BIG);
		return XDP_PASS;
	}
	if ((void *)(pl + STAMP_UNAUTH_SIZE) > end)
		return XDP_PASS;

	/* Session lookup in the order of sixlab.stamp.reflector.Reflector.reflect. */
	__u32 key;
	struct stamp_session *s = 0;
	if (cfg->default_only)
		goto default_session; /* every SSID lookup below would miss */
	if (plen >= STAMP_AUTH_SIZE && (void *)(pl + 28) <= end) {
		key = ((__u32)pl[26] << 8) | pl[27];
		struct stamp_session *a = bpf_map_lookup_elem(&stamp_sessions, &key);
		if (a && a->auth) {
			count(key, R_PASS_AUTH);
			return XDP_PASS;
		}
	}
	__u16 ssid_be = *(__u16 *)(pl + 14);
	key = bpf_ntohs(ssid_be);
	s = bpf_map_lookup_elem(&stamp_sessions, &key);
	if (s && s->auth) {
		/* An unauthenticated packet naming an authenticated session: no session here
		 * (the default one included) answers it; the core drops and counts it. */
		count(key, R_PASS_AUTH);
		return XDP_PASS;
	}
default_session:
	if (!s) {
		key = STAMP_DEFAULT_SSID;
		s = bpf_map_lookup_elem(&stamp_sessions, &key);
		if (!s) {
			count(STAMP_NO_SSID, R_PASS_NO_SESSION);
			return XDP_PASS;
		}
		if (s->auth) {
			count(key, R_PASS_AUTH);
			return XDP_PASS;
		}
	}
	/* Nothing of the packet is believed before its checksum verifies: a damaged Seq, T1
	 * or Error Estimate would otherwise come back in a reply with a fresh, valid
	 * checksum. Summed only once a session would answer it: what was passed above the
	 * kernel verifies itself, and what was dropped no path would answer, damaged or
	 * not. Before the Multiplier check, so that a damaged Multiplier is not counted as
	 * a zero one; before the stateful Seq is taken, so that a packet never answered
	 * does not use one up. A failure is counted without its SSID, which may be the
	 * damaged field, and left to the kernel (see stamp_udp6_csum_ok). */
	if (!stamp_udp6_csum_ok(ctx, udp_offset(&p))) {
		count(STAMP_NO_SSID, R_PASS_BAD_CSUM);
		return XDP_PASS;
	}
	__u16 sender_ee_be = *(__u16 *)(pl + 12);
	if (!(bpf_ntohs(sender_ee_be) & 0xFF)) {
		count(key, R_DROP_MULT_ZERO);
		return XDP_DROP;
	}

	/* TLV area: reflected in the kernel only if it is all Extra Padding (type 1). */
	__u32 off = STAMP_UNAUTH_SIZE;
	__u32 ntlv = 0;
	for (int i = 0; i < STAMP_MAX_TLVS; i++) {
		if (off >= plen)
			break;
		if (off > STAMP_MAX_UDP)
			break;
		__u8 *t = pl + off;
		if ((void *)(t + 4) > end) {
			count(key, R_PASS_TLV);
			return XDP_PASS;
		}
		__u32 vlen = ((__u32)t[2] << 8) | t[3];
		if (t[1] != 1 || off + 4 + vlen > plen) {
			count(key, R_PASS_TLV);
			return XDP_PASS;
		}
		off += 4 + vlen;
		ntlv++;
	}
	if (off != plen) {
		count(key, R_PASS_TLV);
		return XDP_PASS;
	}

	/* Read everything the reply needs before writing anything. */
	__u8 hop = p.ip6->hop_limit;
	__u32 seq_be = *(__u32 *)pl;
	__u64 t1_be = *(__u64 *)(pl + 4);
	__u8 saddr[16], daddr[16], smac[6], dmac[6];
	__builtin_memcpy(saddr, &p.ip6->saddr, 16);
	__builtin_memcpy(daddr, &p.ip6->daddr, 16);
	__builtin_memcpy(smac, p.eth->h_source, 6);
	__builtin_memcpy(dmac, p.eth->h_dest, 6);
	__u16 sport = udp->source, dport = udp->dest;

	__u32 rseq_be = seq_be;
	if (s->mode == STAMP_STATEFUL) {
		struct stamp_flow_key fk;
		__builtin_memset(&fk, 0, sizeof(fk));
		fk.session = key;
		fk.ssid = ((__u32)pl[14] << 8) | pl[15];
		fk.gen = s->gen;
		fk.sport = sport;
		fk.dport = dport;
		__builtin_memcpy(fk.saddr, saddr, 16);
		__builtin_memcpy(fk.daddr, daddr, 16);
		__u32 *next = bpf_map_lookup_elem(&stamp_flows, &fk);
		if (!next) {
			__u32 first = 0;
			bpf_map_update_elem(&stamp_flows, &fk, &first, BPF_NOEXIST);
			next = bpf_map_lookup_elem(&stamp_flows, &fk);
		}
		if (!next) {
			count(key, R_PASS_FLOWS);
			return XDP_PASS;
		}
		rseq_be = bpf_htonl(__sync_fetch_and_add(next, 1));
	}
	__u16 ee_be = bpf_htons(s->ee);

	/* Clear U (0x80) on the Extra Padding TLVs: understood (RFC 8972 §4). */
	off = STAMP_UNAUTH_SIZE;
	for (int i = 0; i < STAMP_MAX_TLVS; i++) {
		if (i >= ntlv || off > STAMP_MAX_UDP)
			break;
		__u8 *t = pl + off;
		if ((void *)(t + 4) > end)
			break;
		t[0] &= 0x7F;
		off += 4 + (((__u32)t[2] << 8) | t[3]);
	}

	/* The reflector layout, RFC 8762 §4.3.1. */
	__u64 t2 = stamp_ts(t2_raw, cfg, s);
	*(__u32 *)pl = rseq_be;
	*(__u16 *)(pl + 12) = ee_be;
	*(__u64 *)(pl + 16) = bpf_cpu_to_be64(t2);
	*(__u32 *)(pl + 24) = seq_be;
	*(__u64 *)(pl + 28) = t1_be;
	*(__u16 *)(pl + 36) = sender_ee_be;
	*(__u16 *)(pl + 38) = 0;
	*(__u32 *)(pl + 40) = 0;
	pl[40] = hop;

	/* The return SID list: the session's, closed by the sender's address unless it
	 * already ends there (as the socket plane's SRH does). */
	__u32 n = s->nsegs;
	if (n > STAMP_MAX_SEGS)
		n = STAMP_MAX_SEGS;
	__u32 skip = 0;
	if (n && same_addr(s->segs[0], saddr))
		skip = 1;
	__u32 nout = n ? 1 + n - skip : 0;
	__u32 srh_out = nout ? 8 + 16 * nout : 0;
	int delta = (int)p.srh_len - (int)srh_out;
	if (delta && bpf_xdp_adjust_head(ctx, delta)) {
		count(key, R_DROP_ADJUST);
		return XDP_DROP;
	}

	void *data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	if ((void *)(ip6 + 1) > end)
		return XDP_DROP;
	__builtin_memcpy(eth->h_dest, smac, 6);
	__builtin_memcpy(eth->h_source, dmac, 6);
	eth->h_proto = bpf_htons(ETH_P_IPV6);
	*(__u32 *)ip6 = bpf_htonl(0x60000000); /* version 6, traffic class 0, flow label 0 */
	ip6->payload_len = bpf_htons(srh_out + ulen);
	ip6->nexthdr = nout ? NH_ROUTING : NH_UDP;
	ip6->hop_limit = cfg->hop_limit;
	__builtin_memcpy(&ip6->saddr, daddr, 16);
	__builtin_memcpy(&ip6->daddr, saddr, 16);
	if (nout) {
		struct srh_fixed *srh = (void *)(ip6 + 1);
		if ((void *)(srh + 1) + 16 > end)
			return XDP_DROP;
		srh->nexthdr = NH_UDP;
		srh->hdrlen = 2 * nout;
		srh->type = SRH_TYPE;
		srh->segments_left = nout - 1;
		srh->last_entry = nout - 1;
		srh->flags = 0;
		srh->tag = 0;
		__u8 *seg = (void *)(srh + 1);
		__builtin_memcpy(seg, saddr, 16); /* Segment List[0]: the final destination */
		for (int i = 0; i < STAMP_MAX_SEGS; i++) {
			__u32 j = i + skip;
			if (j >= n)
				break;
			seg += 16;
			if ((void *)(seg + 16) > end)
				return XDP_DROP;
			__builtin_memcpy(seg, s->segs[j & (STAMP_MAX_SEGS - 1)], 16);
			/* The first segment to visit is the last in the list. */
			__builtin_memcpy(&ip6->daddr, seg, 16);
		}
	}
	udp = (void *)(ip6 + 1) + srh_out;
	if ((void *)(udp + 1) > end)
		return XDP_DROP;
	udp->source = dport;
	udp->dest = sport;
	udp->check = 0;
	pl = (void *)(udp + 1);
	if ((void *)(pl + STAMP_UNAUTH_SIZE) > end)
		return XDP_DROP;

	/* T3: the second reading, as late as the checksum allows. */
	*(__u64 *)(pl + 4) = bpf_cpu_to_be64(stamp_ts(bpf_ktime_get_tai_ns(), cfg, s));

	/* UDP checksum, pseudo-header with the final destination (RFC 8200 §8.1): the
	 * reply's is the sender's address (Segment List[0]), its source ours.
	 * A second full pass rather than an update of the verified sum (RFC 1624): the
	 * pseudo-header and ports sum the same both ways, but nearly all of the 44 base
	 * bytes move or change (T1, Seq, Error Estimate, T2, T3, TTL: RFC 8762 §4.3.1), so
	 * an update (old and new words) would sum more bytes than this pass; it would save
	 * only the Extra Padding area (plus tracking the byte lane of each cleared U flag),
	 * and the verifying sum is in a separate function (stamp_udp6_csum_ok) that would
	 * have to return it. */
	__u64 sum = sum_to_end(sum_pseudo(daddr, saddr, ulen), (__u8 *)udp, end);
	__u16 csum = ~fold(sum);
	udp->check = csum ? csum : 0xFFFF;
	/* The hot counter lives in an array: its lookup is inlined by the JIT. */
	__u64 *reflected = bpf_map_lookup_elem(&stamp_reflected, &key);
	if (reflected)
		*reflected += 1;
	return XDP_TX;
}
