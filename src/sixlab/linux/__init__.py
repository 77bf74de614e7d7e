"""Kernel plumbing that both systems use: BPF, capture sockets, netfilter, signals.

Nothing here knows STAMP or ILNP; the STAMP data planes (``sixlab.dataplane``) and the
ILNP host daemon (``sixlab.ilnp``) are built on it. This package imports nothing else
from sixlab.

- :mod:`sixlab.linux.libbpf`: a small ctypes layer over the system libbpf (open, load,
  attach XDP and tc programs, maps, ring buffers).
- :mod:`sixlab.linux.bpfbuild`: compiles the BPF C sources of ``bpf/`` (CO-RE, clang)
  on first use and caches the objects per kernel, sources and compiler.
- :mod:`sixlab.linux.ccbuild`: compiles a plain C file of the package with gcc on first
  use (the bench generators, the socket plane's batched probe path), cached by source.
- :mod:`sixlab.linux.cbpf`: classic BPF instructions, an assembler, ``SO_ATTACH_FILTER``.
- :mod:`sixlab.linux.packetring`: the TPACKET_V3 receive ring of every capture.
- :mod:`sixlab.linux.nftdrop`: an owned nftables table that keeps the kernel from
  handling packets user space answers.
- :mod:`sixlab.linux.nftcount`: an owned nftables table counting one data flow sent and
  received (the kernel's counts behind RFC 8972 §4.5 direct-mode loss); read with
  pyroute2's nftables netlink dump.
- :mod:`sixlab.linux.signals`: run a foreground program until SIGTERM/SIGINT.
- :mod:`sixlab.linux.unixpath`: claim a Unix socket path for a server (a dead server's
  socket is replaced, a live one refused); the ILNP control socket and the STAMP agent.
- :mod:`sixlab.linux.xsk`: AF_XDP sockets over the system libxdp, with NumPy views of
  the rings and the UMEM (imported on demand: it loads NumPy).

Errors
------
::

    LinuxError (RuntimeError)
    ├── BuildError          a BPF object or a C helper could not be built (compiler, bpftool, BTF)
    ├── LibbpfError         a libbpf call failed (``errno`` set)
    ├── KernelDropError     nftables is missing or refused the table
    ├── FlowCountersError   nftables is missing, refused the counters, or cannot be read
    ├── SocketPathError     a Unix socket path is served by a live server, or not a socket
    └── XskError            an AF_XDP call failed (``errno`` set)
"""

from sixlab.linux.bpfbuild import BuildError
from sixlab.linux.errors import LinuxError, XskError
from sixlab.linux.libbpf import LibbpfError
from sixlab.linux.nftcount import FlowCounters, FlowCountersError, FlowMatch
from sixlab.linux.nftdrop import KernelDrop, KernelDropError
from sixlab.linux.signals import StopOnSignal
from sixlab.linux.unixpath import SocketPathError, clear_stale_socket

__all__ = [
    "BuildError",
    "FlowCounters",
    "FlowCountersError",
    "FlowMatch",
    "KernelDrop",
    "KernelDropError",
    "LibbpfError",
    "LinuxError",
    "SocketPathError",
    "StopOnSignal",
    "XskError",
    "clear_stale_socket",
]
