/* ISA-L's xor_gen (what SPDK's accel software path runs for raid5f parity) on this CPU, measured
 * the way crates/raid/benches/xor.rs measures Ferrite's XOR: `srcs` sources of `len` bytes XORed
 * into one destination, repeated over a working set of `sets` stripes, best of 5 rounds of
 * about 0.3 s. Prints GB/s of source bytes read.
 *
 *   cc -O2 -o xor_isal xor_isal.c -lisal && ./xor_isal SRCS LEN SETS
 */
#include <isa-l/raid.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	int srcs = argc > 1 ? atoi(argv[1]) : 2;
	size_t len = argc > 2 ? strtoul(argv[2], NULL, 0) : 65536;
	int sets = argc > 3 ? atoi(argv[3]) : 1;
	void ***v = calloc(sets, sizeof(*v));
	for (int s = 0; s < sets; s++) {
		v[s] = calloc(srcs + 1, sizeof(void *));
		for (int i = 0; i <= srcs; i++) {
			if (posix_memalign(&v[s][i], 4096, len)) {
				return 1;
			}
			memset(v[s][i], i * 7 + s + 1, len);
		}
	}
	double best = 0;
	for (int round = 0; round < 5; round++) {
		long iters = 0;
		double t0 = now(), t;
		do {
			for (int k = 0; k < 64; k++, iters++) {
				xor_gen(srcs + 1, (int)len, v[iters % sets]);
			}
			t = now() - t0;
		} while (t < 0.3);
		double gbs = (double)iters * srcs * len / t / 1e9;
		if (gbs > best) {
			best = gbs;
		}
	}
	printf("isal xor_gen srcs %d len %zu sets %d: %.2f GB/s\n", srcs, len, sets, best);
	return 0;
}
