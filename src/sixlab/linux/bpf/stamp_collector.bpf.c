// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * STAMP Session-Sender side collector in XDP (RFC 8762 §4.2).
 *
 * For a reflected packet to the sender's port whose SSID is an active session of this
 * agent, T4 = bpf_ktime_get_tai_ns() is taken on entry, the reflector fields are copied
 * raw (as on the wire) into a ring-buffer record, and the packet is consumed
 * (XDP_DROP). The agent drains the ring buffer and feeds the sans-I/O sender core, which
 * matches the record against what it sent exactly as it would a datagram.
 *
 * Only unauthenticated base packets without TLVs (44 bytes) are collected here: an
 * authenticated reply needs its HMAC checked and a TLV area has to reach the core
 * whole, so those, and everything when the ring buffer is full, go on to the kernel
 * (XDP_PASS) and reach the agent through its UDP socket.
 *
 * A reply is recorded only if its UDP checksum verifies (stamp_udp6_csum_ok): one
 * damaged on the way, or with a zero checksum (never valid over IPv6, RFC 8200 §8.1),
 * is counted and passed on to the kernel, whose UDP layer drops it before the agent's
 * socket, as it would without this program.
 */
#include "stamp_common.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Active sender sessions by SSID (the value is unused: presence is activity). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} stamp_senders SEC(".maps");

/* 4 MiB: about 40,000 records, some 40 s of a 1000 pps session between drains. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} stamp_records SEC(".maps");

SEC("xdp")
int stamp_collector(struct xdp_md *ctx)
{
	__u64 t4 = bpf_ktime_get_tai_ns();
	__u32 zero = 0;
	struct stamp_config *cfg = bpf_map_lookup_elem(&stamp_cfg, &zero);
	if (!cfg || !cfg->port)
		return XDP_PASS;
	struct parsed p;
	if (!parse(ctx, cfg->port, &p))
		return XDP_PASS;
	void *end = (void *)(long)ctx->data_end;
	struct udphdr *udp = p.udp;
	__u8 *pl = (void *)(udp + 1);
	__u32 ulen = 8 + STAMP_UNAUTH_SIZE;
	/* The datagram must end the frame: the checksum is summed up to the frame's end.
	 * (The first bound is the one the verifier reads for the loads below.) */
	if (bpf_ntohs(udp->len) != ulen || (void *)(pl + STAMP_UNAUTH_SIZE) > end ||
	    (void *)udp + ulen != end)
		return XDP_PASS;
	__u32 key = ((__u32)pl[14] << 8) | pl[15];
	if (!bpf_map_lookup_elem(&stamp_senders, &key))
		return XDP_PASS;
	/* Counted without the SSID, which may be the damaged field. */
	if (udp->check == 0) {
		count(STAMP_NO_SSID, R_PASS_CSUM);
		return XDP_PASS;
	}
	if (!stamp_udp6_csum_ok(ctx, udp_offset(&p))) {
		count(STAMP_NO_SSID, R_PASS_BAD_CSUM);
		return XDP_PASS;
	}
	struct stamp_record *r = bpf_ringbuf_reserve(&stamp_records, sizeof(*r), 0);
	if (!r) {
		count(key, R_PASS_RINGBUF);
		return XDP_PASS;
	}
	r->t4_tai_ns = t4;
	r->rseq = bpf_ntohl(*(__u32 *)pl);
	r->t3 = bpf_be64_to_cpu(*(__u64 *)(pl + 4));
	r->reflector_ee = bpf_ntohs(*(__u16 *)(pl + 12));
	r->ssid = key;
	r->t2 = bpf_be64_to_cpu(*(__u64 *)(pl + 16));
	r->seq = bpf_ntohl(*(__u32 *)(pl + 24));
	r->t1 = bpf_be64_to_cpu(*(__u64 *)(pl + 28));
	r->sender_ee = bpf_ntohs(*(__u16 *)(pl + 36));
	r->ttl = pl[40];
	r->hop_limit = p.ip6->hop_limit;
	r->sport = bpf_ntohs(udp->source);
	r->dport = bpf_ntohs(udp->dest);
	r->pad = 0;
	__builtin_memcpy(r->src, &p.ip6->saddr, 16);
	__builtin_memcpy(r->dst, &p.ip6->daddr, 16);
	bpf_ringbuf_submit(r, 0);
	count(key, R_COLLECTED);
	return XDP_DROP;
}
