// SPDX-License-Identifier: BSD-2-Clause
/*
 * memlat: the latency of one dependent random read from a working set of a given size.
 *
 * Usage: memlat MIB [MIB ...]   (prints "MIB ns" per line)
 *
 * A random cyclic permutation of the cache lines of a MIB-sized block is walked, each
 * line holding the address of the next: every load depends on the one before, so the
 * loads cannot overlap and the time per step is the latency of a read that hits
 * wherever a block of that size lives (L1/L2/L3/DRAM), TLB misses included. The block
 * is mmap'ed and advised MADV_HUGEPAGE (as glibc does for large blocks with
 * glibc.malloc.hugetlb=1), the most favourable case for a big table.
 *
 * Why it exists: `bench_ilnp.py memlat` puts these figures next to the ILCC lookup
 * (`bench_ilnp.py ilcc`). A hash table of 1M entries spans at least 16 MiB (8-byte
 * key, 8-byte reference), so a random lookup makes at least one such read that a
 * 10-entry table does not; that read alone bounds the ratio of the two lookup times
 * from below.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#define LINE 64
#define STEPS 20000000L

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* xorshift64*: a fixed seed, so every run walks the same permutation. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static uint64_t next_random(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

static int measure(size_t mib)
{
	size_t lines = mib * 1024 * 1024 / LINE;
	if (lines < 2) {
		fprintf(stderr, "memlat: %zu MiB is too small\n", mib);
		return 1;
	}
	char *block = mmap(NULL, lines * LINE, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	size_t *order = malloc(lines * sizeof(*order));
	if (block == MAP_FAILED || order == NULL) {
		fprintf(stderr, "memlat: cannot allocate %zu MiB\n", mib);
		return 1;
	}
	madvise(block, lines * LINE, MADV_HUGEPAGE); /* advice only: may be refused */
	for (size_t i = 0; i < lines; i++)
		order[i] = i;
	for (size_t i = lines - 1; i > 0; i--) { /* Fisher-Yates */
		size_t j = next_random() % (i + 1);
		size_t t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
	for (size_t i = 0; i < lines; i++)
		*(char **)(block + order[i] * LINE) = block + order[(i + 1) % lines] * LINE;
	char *p = block + order[0] * LINE;
	for (long i = 0; i < STEPS / 10; i++) /* warm-up: page faults, TLB */
		p = *(char **)p;
	double t0 = now_s();
	for (long i = 0; i < STEPS; i++)
		p = *(char **)p;
	double t1 = now_s();
	/* Printing p keeps the walk from being optimised away. */
	printf("%zu %.1f %d\n", mib, (t1 - t0) / STEPS * 1e9, p != NULL);
	munmap(block, lines * LINE);
	free(order);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: memlat MIB [MIB ...]\n");
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		char *rest;
		long mib = strtol(argv[i], &rest, 10);
		if (*rest != '\0' || mib < 1 || mib > 65536) {
			fprintf(stderr, "memlat: bad size %s (MiB, 1..65536)\n", argv[i]);
			return 2;
		}
		if (measure((size_t)mib))
			return 1;
	}
	return 0;
}
