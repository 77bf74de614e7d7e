/*
 * udpecho: a UDP echo server (RFC 862) that batches its system calls.
 *
 * Built and run by sixlab.bench.ilnp_echo as the application of the ILNP echo bench.
 * It is an ordinary application: it binds an IPv6 address and port and knows nothing
 * of ILNP (under the ILNP daemon that address is the host's identifier address).
 *
 *   udpecho ADDRESS PORT [BATCH]
 *
 * Theory of operation: one blocking socket; recvmmsg(2) with MSG_WAITFORONE waits for
 * the first datagram and then takes whatever else is already queued, up to BATCH (64
 * by default, at most MAX_BATCH); sendmmsg(2) sends each datagram back to its source
 * address, unchanged. Why batches: one system call per datagram would make the echo
 * server, not the ILNP host it sits behind, the limit of the bench. A datagram whose
 * send fails is counted (send_errors) and skipped; sendmmsg(2) reports only the count
 * sent before a failure, so the message at the short count is that failure.
 *
 * Prints "ready" once bound, then runs until SIGTERM or SIGINT and prints one JSON
 * object: received, sent, send_errors, truncated, recv_calls, send_calls.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define MAX_BATCH 256
/* Larger than any datagram the bench sends (the daemon's TUN MTU is 1400). */
#define MAX_DATAGRAM 2048
/* Socket buffers: room for several batches while the other process on the CPU runs. */
#define SOCKET_BUFFER (8 << 20)

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static void set_buffer(int fd, int force, int plain) {
    int size = SOCKET_BUFFER;
    /* The FORCE variant ignores rmem_max/wmem_max (needs CAP_NET_ADMIN; the bench is root). */
    if (setsockopt(fd, SOL_SOCKET, force, &size, sizeof size) < 0)
        setsockopt(fd, SOL_SOCKET, plain, &size, sizeof size);
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s ADDRESS PORT [BATCH]\n", argv[0]);
        return 2;
    }
    struct sockaddr_in6 local;
    memset(&local, 0, sizeof local);
    local.sin6_family = AF_INET6;
    int port = atoi(argv[2]);
    int batch = argc == 4 ? atoi(argv[3]) : 64;
    if (inet_pton(AF_INET6, argv[1], &local.sin6_addr) != 1 || port < 1 || port > 65535 ||
        batch < 1 || batch > MAX_BATCH) {
        fprintf(stderr, "udpecho: bad arguments\n");
        return 2;
    }
    local.sin6_port = htons((uint16_t)port);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: recvmmsg returns EINTR */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    int fd = socket(AF_INET6, SOCK_DGRAM, 0);
    if (fd < 0) { perror("socket"); return 1; }
    set_buffer(fd, SO_RCVBUFFORCE, SO_RCVBUF);
    set_buffer(fd, SO_SNDBUFFORCE, SO_SNDBUF);
    if (bind(fd, (struct sockaddr *)&local, sizeof local) < 0) { perror("bind"); return 1; }
    printf("ready\n");
    fflush(stdout);

    static uint8_t data[MAX_BATCH][MAX_DATAGRAM];
    static struct sockaddr_in6 peers[MAX_BATCH];
    static struct iovec iov[MAX_BATCH];
    static struct mmsghdr msgs[MAX_BATCH];
    uint64_t received = 0, sent = 0, errors = 0, truncated = 0, rcalls = 0, scalls = 0;
    while (!stop) {
        for (int i = 0; i < batch; i++) {
            iov[i].iov_base = data[i];
            iov[i].iov_len = MAX_DATAGRAM;
            memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
            msgs[i].msg_hdr.msg_name = &peers[i];
            msgs[i].msg_hdr.msg_namelen = sizeof peers[i];
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        int n = recvmmsg(fd, msgs, (unsigned)batch, MSG_WAITFORONE, NULL);
        rcalls++;
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("recvmmsg");
            return 1;
        }
        received += (uint64_t)n;
        /* Echo what arrived: same bytes, back to the source; receive lengths become send
           lengths. A truncated datagram (larger than MAX_DATAGRAM) is not echoed. */
        int out = 0;
        for (int i = 0; i < n; i++) {
            if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) { truncated++; continue; }
            iov[i].iov_len = msgs[i].msg_len;
            if (out != i) {
                msgs[out].msg_hdr = msgs[i].msg_hdr;
            }
            out++;
        }
        int done = 0;
        while (done < out) {
            int r = sendmmsg(fd, msgs + done, (unsigned)(out - done), 0);
            scalls++;
            if (r < 0) {
                if (errno == EINTR) continue;
                errors++; /* this message failed (e.g. no route yet): skip it */
                done++;
                continue;
            }
            sent += (uint64_t)r;
            done += r;
            if (done < out) { errors++; done++; } /* the message at the short count */
        }
    }
    printf("{\"received\": %llu, \"sent\": %llu, \"send_errors\": %llu, \"truncated\": %llu, "
           "\"recv_calls\": %llu, \"send_calls\": %llu}\n",
           (unsigned long long)received, (unsigned long long)sent, (unsigned long long)errors,
           (unsigned long long)truncated, (unsigned long long)rcalls, (unsigned long long)scalls);
    return 0;
}
