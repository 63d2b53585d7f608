/* cpu_hog: a stand-in for the rest of a shared machine (a compiler, a test suite) in
 * bench/iscsi_vs_peers.sh's LOAD runs: spins BUSY_US microseconds, sleeps SLEEP_US, forever
 * (SLEEP_US 0: spins without pause, a CPU-bound thread).
 * Build: cc -O2 -o cpu_hog cpu_hog.c.  Usage: cpu_hog BUSY_US SLEEP_US
 */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000L + t.tv_nsec / 1000;
}

int main(int argc, char **argv) {
  if (argc != 3)
    return 2;
  long busy = atol(argv[1]), rest = atol(argv[2]);
  for (;;) {
    long t = now_us();
    while (now_us() - t < busy)
      ;
    if (rest)
      usleep(rest);
  }
}
