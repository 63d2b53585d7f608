/* iscsi_rw: a libiscsi load generator for bench/iscsi_vs_peers.sh, where libiscsi's own
 * iscsi-perf (1.19) cannot go: it only reads. One session, one thread, one poll() loop, the
 * shape of iscsi-perf (so the two cost the client about the same per I/O), with:
 *   -w randwrite  WRITE(16) of -o bytes at random aligned LBAs, -q in flight, for -t seconds;
 *   -w randread   READ(16), the same way (to check it against iscsi-perf);
 *   -w fill       WRITE(16) of -o bytes over the whole LUN once, in order, -q in flight: so
 *                 that later reads are served from memory that was really written.
 * Prints "ios N seconds S iops I" at the end; exits non-zero on any failed command.
 * Build: cc -O2 -o iscsi_rw iscsi_rw.c -liscsi (Debian: libiscsi-dev).
 * Usage: iscsi_rw -w randwrite|randread|fill [-q QD] [-o BYTES] [-t SECONDS] iscsi://HOST:PORT/IQN/LUN
 */
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct iscsi_context *ctx;
static int lun, blocksize, qd = 1, in_flight, writes, fill, stop;
static uint32_t io_blocks, io_bytes;
static uint64_t num_blocks, next_lba, done, rng = 0x9e3779b97f4a7c15ull;
static unsigned char *buf;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static uint64_t rand64(void) { /* xorshift64 */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void submit(void);

static void cb(struct iscsi_context *c, int status, void *data, void *priv) {
  struct scsi_task *task = data;
  (void)priv;
  if (status != SCSI_STATUS_GOOD) {
    fprintf(stderr, "iscsi_rw: command failed: status %d, %s\n", status, iscsi_get_error(c));
    exit(2);
  }
  scsi_free_scsi_task(task);
  in_flight--;
  done++;
  submit();
}

static void submit(void) {
  while (!stop && in_flight < qd) {
    uint64_t lba;
    struct scsi_task *t;
    if (fill) {
      if (next_lba >= num_blocks) return;
      lba = next_lba;
      next_lba += io_blocks;
    } else {
      lba = rand64() % (num_blocks / io_blocks) * io_blocks;
    }
    if (writes)
      t = iscsi_write16_task(ctx, lun, lba, buf, io_bytes, blocksize, 0, 0, 0, 0, 0, cb, NULL);
    else
      t = iscsi_read16_task(ctx, lun, lba, io_bytes, blocksize, 0, 0, 0, 0, 0, cb, NULL);
    if (!t) {
      fprintf(stderr, "iscsi_rw: cannot queue a command: %s\n", iscsi_get_error(ctx));
      exit(2);
    }
    in_flight++;
  }
}

int main(int argc, char **argv) {
  const char *w = "randwrite";
  double seconds = 10, t0, end;
  int opt;
  io_bytes = 4096;
  while ((opt = getopt(argc, argv, "w:q:o:t:")) != -1) {
    switch (opt) {
    case 'w': w = optarg; break;
    case 'q': qd = atoi(optarg); break;
    case 'o': io_bytes = (uint32_t)atoi(optarg); break;
    case 't': seconds = atof(optarg); break;
    default: fprintf(stderr, "usage: iscsi_rw -w randwrite|randread|fill [-q QD] [-o BYTES] [-t SECONDS] URL\n"); return 1;
    }
  }
  if (optind != argc - 1 || qd < 1) { fprintf(stderr, "iscsi_rw: one URL expected\n"); return 1; }
  if (strcmp(w, "randread") && strcmp(w, "randwrite") && strcmp(w, "fill")) {
    fprintf(stderr, "iscsi_rw: unknown workload %s\n", w);
    return 1;
  }
  writes = strcmp(w, "randread") != 0;
  fill = strcmp(w, "fill") == 0;
  ctx = iscsi_create_context("iqn.2026-11.io.ferrite:bench");
  struct iscsi_url *url = iscsi_parse_full_url(ctx, argv[optind]);
  if (!url) { fprintf(stderr, "iscsi_rw: bad URL: %s\n", iscsi_get_error(ctx)); return 1; }
  iscsi_set_targetname(ctx, url->target);
  iscsi_set_session_type(ctx, ISCSI_SESSION_NORMAL);
  iscsi_set_header_digest(ctx, ISCSI_HEADER_DIGEST_NONE);
  if (iscsi_full_connect_sync(ctx, url->portal, url->lun)) {
    fprintf(stderr, "iscsi_rw: login failed: %s\n", iscsi_get_error(ctx));
    return 1;
  }
  lun = url->lun;
  struct scsi_task *rc = iscsi_readcapacity16_sync(ctx, lun);
  struct scsi_readcapacity16 *cap = rc && rc->status == SCSI_STATUS_GOOD ? scsi_datain_unmarshall(rc) : NULL;
  if (!cap) { fprintf(stderr, "iscsi_rw: READ CAPACITY(16) failed\n"); return 1; }
  blocksize = (int)cap->block_length;
  num_blocks = cap->returned_lba + 1;
  scsi_free_scsi_task(rc);
  if (io_bytes % blocksize || io_bytes / blocksize > num_blocks) {
    fprintf(stderr, "iscsi_rw: -o %u does not fit blocks of %d\n", io_bytes, blocksize);
    return 1;
  }
  io_blocks = io_bytes / blocksize;
  buf = malloc(io_bytes);
  for (uint32_t i = 0; i < io_bytes; i++) buf[i] = (unsigned char)rand64();
  rng ^= (uint64_t)getpid() << 32 ^ (uint64_t)(now() * 1e9);
  t0 = now();
  end = t0 + seconds;
  submit();
  while (in_flight) {
    struct pollfd p = {.fd = iscsi_get_fd(ctx), .events = iscsi_which_events(ctx)};
    if (poll(&p, 1, 1000) < 0) continue;
    if (iscsi_service(ctx, p.revents) < 0) {
      fprintf(stderr, "iscsi_rw: %s\n", iscsi_get_error(ctx));
      return 2;
    }
    if (!fill && !stop && now() >= end) stop = 1; /* drain what is in flight, then stop */
  }
  double s = now() - t0;
  printf("ios %llu seconds %.3f iops %.0f\n", (unsigned long long)done, s, done / s);
  iscsi_logout_sync(ctx);
  iscsi_destroy_context(ctx);
  return 0;
}
