// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * XDP_PASS and nothing else. A veth delivers frames that its peer sends with XDP_TX
 * only when it runs an XDP program itself (the frames travel through its XDP ring), so
 * testbeds and benchmarks attach this one to the peer of an interface running the
 * reflector (sixlab.dataplane.xdp_plane.attach_xdp_pass).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("xdp")
int sixlab_xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}
