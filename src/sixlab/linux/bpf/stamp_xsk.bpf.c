// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Steer the STAMP packets of active sessions into an AF_XDP socket (the afxdp plane).
 *
 * A frame goes to the socket of its receive queue (xsk_sockets, an XSKMAP) when it is
 * IPv6 + [SRH at Segments Left 0] + UDP to the configured port (parse() of
 * stamp_common.h) and its SSID names an active session: the unauthenticated layout's
 * SSID (bytes 14:16 of the UDP payload, RFC 8972 §3) or the authenticated one's
 * (bytes 26:28), or any SSID once the default session is active (key
 * STAMP_DEFAULT_SSID). Everything else goes on to the kernel untouched (XDP_PASS), as
 * does a frame whose queue has no socket (bpf_redirect_map's fallback action).
 *
 * Only a frame whose UDP checksum verifies (stamp_udp6_csum_ok, RFC 8200 §8.1) goes to
 * the socket, so user space need not sum it again; one that does not is passed to the
 * kernel, whose UDP layer drops it if it is damaged (as the xdp plane's programs do).
 * A zero checksum field (never valid over IPv6) is passed too.
 *
 * The arrival time, bpf_ktime_get_tai_ns(), travels with the frame in 8 bytes of XDP
 * metadata right before it (bpf_xdp_adjust_meta): the kernel copies the metadata into
 * the UMEM in copy mode too (xsk_copy_xdp in net/xdp/xsk.c), and user space reads T2
 * (reflector) or T4 (sender) there. A frame whose metadata cannot be made is passed.
 */
#include "stamp_common.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} xsk_sockets SEC(".maps");

/* Active sessions by SSID; STAMP_DEFAULT_SSID: every SSID. The value is unused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} xsk_ssids SEC(".maps");

enum xsk_reason {
	X_REDIRECTED = 0,
	X_PASS_NO_SESSION = 1,
	X_PASS_SHORT = 2,
	X_PASS_META = 3,
	X_PASS_CSUM = 4,
};

SEC("xdp")
int stamp_xsk(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct stamp_config *cfg = bpf_map_lookup_elem(&stamp_cfg, &zero);
	if (!cfg || !cfg->port)
		return XDP_PASS;
	struct parsed p;
	if (!parse(ctx, cfg->port, &p))
		return XDP_PASS;
	__u64 now = bpf_ktime_get_tai_ns();
	void *end = (void *)(long)ctx->data_end;
	__u8 *payload = (__u8 *)(p.udp + 1);
	__u32 key = STAMP_DEFAULT_SSID;
	if (!bpf_map_lookup_elem(&xsk_ssids, &key)) {
		if ((void *)(payload + 16) > end) {
			count(STAMP_NO_SSID, X_PASS_SHORT);
			return XDP_PASS;
		}
		key = ((__u32)payload[14] << 8) | payload[15];
		if (!bpf_map_lookup_elem(&xsk_ssids, &key)) {
			if ((void *)(payload + 28) > end) {
				count(STAMP_NO_SSID, X_PASS_NO_SESSION);
				return XDP_PASS;
			}
			key = ((__u32)payload[26] << 8) | payload[27];
			if (!bpf_map_lookup_elem(&xsk_ssids, &key)) {
				count(STAMP_NO_SSID, X_PASS_NO_SESSION);
				return XDP_PASS;
			}
		}
	}
	if (!p.udp->check || !stamp_udp6_csum_ok(ctx, udp_offset(&p))) {
		count(STAMP_NO_SSID, X_PASS_CSUM);
		return XDP_PASS;
	}
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(__u64))) {
		count(STAMP_NO_SSID, X_PASS_META);
		return XDP_PASS;
	}
	void *data = (void *)(long)ctx->data;
	__u64 *meta = (void *)(long)ctx->data_meta;
	if ((void *)(meta + 1) > data) {
		count(STAMP_NO_SSID, X_PASS_META);
		return XDP_PASS;
	}
	*meta = now;
	return bpf_redirect_map(&xsk_sockets, ctx->rx_queue_index, XDP_PASS);
}
