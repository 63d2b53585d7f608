//! `ferrite blobstore`: offline tools for blobstores in SPDK's on-disk format (lvstores).

use ferrite_blob::offline;
use std::path::PathBuf;

/// Arguments of `ferrite blobstore`.
#[derive(clap::Args, Debug)]
pub struct BlobstoreArgs {
    #[command(subcommand)]
    cmd: BlobstoreCmd,
}

#[derive(clap::Subcommand, Debug)]
enum BlobstoreCmd {
    /// Print the super block, the masks and every blob (flags, xattrs, clusters, parent).
    Dump {
        /// Image file or block device holding the blobstore (read only).
        file: PathBuf,
    },
    /// Check the metadata's consistency. Exit status: 0 consistent, 1 problems found, 2 the
    /// image could not be read as a blobstore, 3 only problems the next load repairs: not
    /// unloaded cleanly (after a crash: stale masks, an interrupted snapshot operation or
    /// grow), or clean with a cluster mask shorter than the store (the next unload rewrites it).
    Check {
        /// Image file or block device holding the blobstore (read only).
        file: PathBuf,
    },
}

/// Most problems `check` prints one per line; the rest are counted.
const MAX_PRINTED: usize = 1000;

/// Runs the subcommand; returns the exit status.
pub fn run(args: BlobstoreArgs) -> i32 {
    let (file, is_check) = match &args.cmd {
        BlobstoreCmd::Dump { file } => (file, false),
        BlobstoreCmd::Check { file } => (file, true),
    };
    let dev = match std::fs::File::open(file) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("ferrite blobstore: {}: {e}", file.display());
            return 2;
        }
    };
    let img = match offline::open(&dev, &offline::OpenOptions::default()) {
        Ok(img) => img,
        Err(e) => {
            eprintln!("ferrite blobstore: {}: {e}", file.display());
            return 2;
        }
    };
    if !is_check {
        print!("{}", offline::dump(&img));
        return 0;
    }
    let report = offline::check(&img);
    println!(
        "{}: {} blobs, {} md pages and {} clusters in use, {}",
        file.display(),
        report.blobs,
        report.used_pages,
        report.used_clusters,
        if report.clean { "clean" } else { "not clean" }
    );
    for p in report.problems.iter().take(MAX_PRINTED) {
        println!("problem: {p}");
    }
    if report.problems.len() > MAX_PRINTED {
        println!("... and {} more problems", report.problems.len() - MAX_PRINTED);
    }
    if report.is_ok() {
        println!("no problems found");
        0
    } else if report.only_load_repairs() && report.clean {
        println!(
            "{} problems found, all of them what the store loads with and its next unload repairs (it writes \
             the whole cluster mask)",
            report.problems.len()
        );
        3
    } else if report.only_load_repairs() {
        println!(
            "{} problems found, all of them what the next load repairs (it rebuilds the masks from the \
             metadata and finishes interrupted snapshot operations)",
            report.problems.len()
        );
        3
    } else {
        println!("{} problems found", report.problems.len());
        1
    }
}
