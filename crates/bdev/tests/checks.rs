//! Request checking (range, payload, permission) and create/register argument checking.

mod common;

use common::*;
use ferrite_bdev::channel::local_iostat;
use ferrite_bdev::{
    lookup, register, unregister, BackendChannel, Bdev, BdevBackend, BdevError, BdevProps, IoRequest, IoStatus, IoType,
    IoTypes,
};
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_modules::null::{self, NullOpts};
use ferrite_reactor::{alloc_buf, ReactorMode};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::sync::Arc;

fn malloc_bdev(name: &str, num_blocks: u64, block_size: u32) -> Bdev {
    malloc::create(MallocOpts { name: Some(name.into()), num_blocks, block_size, uuid: None, ..Default::default() })
        .expect("malloc create")
}

#[test]
fn invalid_requests_fail_without_reaching_the_module() {
    let e = engine(1, ReactorMode::Interrupt);
    const NAME: &str = "checks_invalid_requests";
    let bdev = malloc_bdev(NAME, 64, 512);
    let id = bdev.id();
    let errors = run(&e, 0, move || async move {
        let desc = Bdev::open(NAME, true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let disk = pattern(1, 64 * 512);
        io_ok(&ch, IoRequest::write(0, 64, buf_from(&disk))).await;

        // Every rejected request: (request, expected status). Read buffers are filled with 0xee and
        // must come back untouched; write payloads hold 0x5a and must not land anywhere.
        let bad: Vec<(&str, IoRequest, IoStatus)> = vec![
            ("read at the end", IoRequest::read(64, 1, buf_filled(512, 0xee)), IoStatus::OutOfRange),
            ("read across the end", IoRequest::read(63, 2, buf_filled(1024, 0xee)), IoStatus::OutOfRange),
            ("write across the end", IoRequest::write(63, 2, buf_filled(1024, 0x5a)), IoStatus::OutOfRange),
            ("offset overflow", IoRequest::read(u64::MAX, 2, buf_filled(1024, 0xee)), IoStatus::OutOfRange),
            ("write offset overflow", IoRequest::write(u64::MAX - 1, 2, buf_filled(1024, 0x5a)), IoStatus::OutOfRange),
            ("zero-length read", IoRequest::read(0, 0, alloc_buf(0)), IoStatus::OutOfRange),
            ("zero-length write", IoRequest::write(3, 0, alloc_buf(0)), IoStatus::OutOfRange),
            ("zero-length unmap", IoRequest::no_payload(IoType::Unmap, 0, 0), IoStatus::OutOfRange),
            ("unmap across the end", IoRequest::no_payload(IoType::Unmap, 60, 5), IoStatus::OutOfRange),
            ("write_zeroes at the end", IoRequest::no_payload(IoType::WriteZeroes, 64, 1), IoStatus::OutOfRange),
            ("short payload", IoRequest::read(0, 2, buf_filled(512, 0xee)), IoStatus::Misaligned),
            ("long payload", IoRequest::write(0, 1, buf_filled(1024, 0x5a)), IoStatus::Misaligned),
            ("unaligned buffer", IoRequest::read(0, 1, buf_filled(500, 0xee)), IoStatus::Misaligned),
            ("zero-copy read at the end", IoRequest::read_zcopy(64, 1), IoStatus::OutOfRange),
            ("zero-length zero-copy read", IoRequest::read_zcopy(0, 0), IoStatus::OutOfRange),
        ];
        let mut errors = 0;
        for (what, req, want) in bad {
            let is_read = req.io_type == IoType::Read;
            let c = io(&ch, req).await;
            assert_eq!(c.status, want, "{what}");
            if is_read {
                assert!(payload(&c).iter().all(|&b| b == 0xee), "{what}: the read buffer was written");
            }
            errors += 1;
        }

        // A read-only descriptor cannot change the bdev, but can read it.
        let ro = Bdev::open(NAME, false, || {}).unwrap();
        assert!(!ro.writable());
        let rch = ro.channel().unwrap();
        for (what, req) in [
            ("write", IoRequest::write(0, 1, buf_filled(512, 0x5a))),
            ("unmap", IoRequest::no_payload(IoType::Unmap, 0, 1)),
            ("write_zeroes", IoRequest::no_payload(IoType::WriteZeroes, 0, 1)),
        ] {
            assert_eq!(io(&rch, req).await.status, IoStatus::Failed(libc::EBADF), "{what} through a read-only desc");
            errors += 1;
        }
        let got = io_ok(&rch, IoRequest::read(0, 64, alloc_buf(64 * 512))).await;
        assert_bytes_eq(&got, &disk, "content after rejected requests");

        // Valid I/O still works, through both descriptors.
        let new = pattern(2, 2 * 512);
        io_ok(&ch, IoRequest::write(62, 2, buf_from(&new))).await;
        assert_bytes_eq(&io_ok(&rch, IoRequest::read(62, 2, alloc_buf(1024))).await, &new, "last two blocks");
        assert_bytes_eq(&io_ok(&ch, IoRequest::read(0, 62, alloc_buf(62 * 512))).await, &disk[..62 * 512], "rest");
        assert_eq!(io(&ch, IoRequest::no_payload(IoType::Flush, 0, 0)).await.status, IoStatus::Success);
        assert_eq!(io(&ch, IoRequest::no_payload(IoType::Reset, 0, 0)).await.status, IoStatus::Success);

        let st = local_iostat(id);
        assert_eq!(st.io_errors, errors, "every rejected request counts as an error");
        assert_eq!((st.num_write_ops, st.bytes_written), (2, 64 * 512 + 1024));
        assert_eq!((st.num_read_ops, st.bytes_read), (3, 64 * 512 + 1024 + 62 * 512));
        errors
    });
    assert_eq!(errors, 18);
    unregister(NAME, Some("malloc")).unwrap();
    shutdown(e);
}

/// A request whose block count is so large that `num_blocks * block_size` overflows must complete
/// with OutOfRange like any other out-of-range request.
#[test]
fn huge_block_count_is_out_of_range() {
    let e = engine(1, ReactorMode::Interrupt);
    const NAME: &str = "checks_huge_block_count";
    malloc_bdev(NAME, 64, 512);
    let statuses = run(&e, 0, || async {
        let desc = Bdev::open(NAME, true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let mut v = Vec::new();
        for nb in [u64::MAX, u64::MAX / 2, (u64::MAX / 512) + 1] {
            v.push(io(&ch, IoRequest::read(0, nb, alloc_buf(512))).await.status);
            v.push(io(&ch, IoRequest::no_payload(IoType::Unmap, 1, nb)).await.status);
        }
        v
    });
    assert!(statuses.iter().all(|&s| s == IoStatus::OutOfRange), "{statuses:?}");
    unregister(NAME, None).unwrap();
    shutdown(e);
}

struct NoBackend;

impl BdevBackend for NoBackend {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Err(BdevError::Invalid("no channels".into()))
    }
    fn config_entry(&self, _: &Bdev) -> Option<serde_json::Value> {
        None
    }
}

fn props(name: &str, block_size: u32, num_blocks: u64) -> BdevProps {
    BdevProps {
        name: name.into(),
        aliases: vec![],
        uuid: None,
        block_size,
        num_blocks,
        product_name: "Test disk",
        module: "test",
        io_types: IoTypes::of(&[IoType::Read]),
        limits: Default::default(),
    }
}

#[test]
fn bad_create_arguments_are_rejected() {
    let invalid = |r: Result<Bdev, BdevError>, what: &str| match r {
        Err(BdevError::Invalid(_)) => {}
        Err(e) => panic!("{what}: expected Invalid, got {e:?}"),
        Ok(b) => panic!("{what}: created {}", b.name()),
    };
    let m = |name: &str, num_blocks, block_size| {
        malloc::create(MallocOpts { name: Some(name.into()), num_blocks, block_size, uuid: None, ..Default::default() })
    };
    let n = |name: &str, num_blocks, block_size| {
        null::create(NullOpts { name: name.into(), num_blocks, block_size, uuid: None, ..Default::default() })
    };
    for (bs, nb) in [(1000, 64), (256, 64), (0, 64), (131072, 64), (513, 64), (512, 0), (4096, u64::MAX / 1024)] {
        invalid(m("checks_bad_geometry_m", nb, bs), &format!("malloc {nb} x {bs}"));
        invalid(n("checks_bad_geometry_n", nb, bs), &format!("null {nb} x {bs}"));
        invalid(
            register(props("checks_bad_geometry_r", bs, nb), Arc::new(NoBackend)),
            &format!("register {nb} x {bs}"),
        );
    }
    for name in ["checks_bad_geometry_m", "checks_bad_geometry_n", "checks_bad_geometry_r"] {
        assert!(lookup(name).is_none(), "{name} was registered by a failed create");
    }
    invalid(register(props("", 512, 8), Arc::new(NoBackend)), "empty name");

    // Good geometry at the limits.
    let a = m("checks_limits_a", 1, 65536).expect("64 KiB blocks");
    assert_eq!((a.block_size(), a.num_blocks(), a.size_bytes()), (65536, 1, 65536));
    let b = n("checks_limits_b", 1 << 40, 512).expect("a huge null bdev");
    assert_eq!(b.size_bytes(), 512 << 40);

    // Duplicate names, across modules and through aliases.
    let exists = |r: Result<Bdev, BdevError>, what: &str| match r {
        Err(BdevError::Exists(_)) => {}
        Err(e) => panic!("{what}: expected Exists, got {e:?}"),
        Ok(b) => panic!("{what}: created {}", b.name()),
    };
    let first = m("checks_dup", 8, 512).unwrap();
    exists(m("checks_dup", 8, 512), "malloc with a taken name");
    exists(n("checks_dup", 8, 512), "null with a taken name");
    let mut p = props("checks_dup_alias_owner", 512, 8);
    p.aliases = vec!["checks_dup".into()];
    exists(register(p, Arc::new(NoBackend)), "alias equal to a taken name");
    assert!(lookup("checks_dup_alias_owner").is_none());
    let mut p = props("checks_alias_owner", 512, 8);
    p.aliases = vec!["checks_alias".into()];
    let owner = register(p, Arc::new(NoBackend)).unwrap();
    exists(m("checks_alias", 8, 512), "name equal to a taken alias");
    assert_eq!(lookup("checks_alias").map(|b| b.id()), Some(owner.id()));
    assert_eq!(lookup("checks_dup").map(|b| b.id()), Some(first.id()), "the first bdev is untouched");

    // UUIDs: given ones are kept, duplicates and malformed ones are refused.
    let u = "6f1a3c2e-8d4b-4e8f-9a7c-1b2d3e4f5a6b";
    let withu = malloc::create(MallocOpts {
        name: Some("checks_uuid_a".into()),
        num_blocks: 8,
        block_size: 512,
        uuid: Some(u.into()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(withu.uuid().to_string(), u);
    assert_eq!(lookup(u).map(|b| b.id()), Some(withu.id()), "lookup by uuid");
    exists(
        malloc::create(MallocOpts {
            name: Some("checks_uuid_b".into()),
            num_blocks: 8,
            block_size: 512,
            uuid: Some(u.into()),
            ..Default::default()
        }),
        "malloc with a taken uuid",
    );
    exists(
        null::create(NullOpts {
            name: "checks_uuid_c".into(),
            num_blocks: 8,
            block_size: 512,
            uuid: Some(u.into()),
            ..Default::default()
        }),
        "null with a taken uuid",
    );
    for bad in ["not-a-uuid", "6f1a3c2e-8d4b-4e8f-9a7c", ""] {
        invalid(
            malloc::create(MallocOpts {
                name: Some("checks_uuid_d".into()),
                num_blocks: 8,
                block_size: 512,
                uuid: Some(bad.into()),
                ..Default::default()
            }),
            &format!("malloc uuid {bad:?}"),
        );
        invalid(
            null::create(NullOpts {
                name: "checks_uuid_e".into(),
                num_blocks: 8,
                block_size: 512,
                uuid: Some(bad.into()),
                ..Default::default()
            }),
            &format!("null uuid {bad:?}"),
        );
    }
    for name in ["checks_uuid_b", "checks_uuid_c", "checks_uuid_d", "checks_uuid_e"] {
        assert!(lookup(name).is_none(), "{name} was registered by a failed create");
    }

    // Unregistering checks the name and the module.
    assert!(matches!(unregister("checks_no_such_bdev", None), Err(BdevError::NotFound(_))));
    assert!(matches!(unregister("checks_dup", Some("null")), Err(BdevError::NotFound(_))));
    assert!(lookup("checks_dup").is_some(), "a refused unregister must keep the bdev");
    for (name, module) in [
        ("checks_limits_a", "malloc"),
        ("checks_limits_b", "null"),
        ("checks_dup", "malloc"),
        ("checks_alias_owner", "test"),
        ("checks_uuid_a", "malloc"),
    ] {
        unregister(name, Some(module)).unwrap();
        assert!(lookup(name).is_none());
    }
    assert!(lookup("checks_alias").is_none(), "aliases leave with their bdev");
    assert!(lookup(u).is_none());
}

/// One generated request against the 16-block bdev of the property test.
#[derive(Debug, Clone)]
struct Case {
    write: bool,
    offset: u64,
    num_blocks: u64,
    lens: Vec<usize>,
    seed: u64,
}

const PROP_BLOCKS: u64 = 16;

fn case_strategy() -> impl Strategy<Value = Case> {
    let offset = prop_oneof![8 => 0u64..16, 1 => 14u64..20, 1 => (u64::MAX - 20)..=u64::MAX, 1 => any::<u64>()];
    let num_blocks = prop_oneof![8 => 1u64..=8, 2 => 0u64..=20, 1 => (1u64 << 40)..(1u64 << 41)];
    (any::<bool>(), offset, num_blocks, any::<u64>(), 0u8..3).prop_flat_map(
        |(write, offset, num_blocks, seed, kind)| {
            let total = (num_blocks.min(20) * 512) as usize;
            let lens: BoxedStrategy<Vec<usize>> = match kind {
                // One buffer of exactly the right size.
                0 => Just(vec![total]).boxed(),
                // Two or three buffers split at block boundaries (empty pieces are allowed).
                1 => proptest::collection::vec(0..=total / 512, 1..=2)
                    .prop_map(move |mut cuts| {
                        cuts.sort_unstable();
                        let mut lens = Vec::new();
                        let mut prev = 0;
                        for c in cuts {
                            lens.push((c - prev) * 512);
                            prev = c;
                        }
                        lens.push(total - prev * 512);
                        lens
                    })
                    .boxed(),
                // Anything: often the wrong total or not a multiple of 512.
                _ => proptest::collection::vec(prop_oneof![(0usize..=12).prop_map(|k| k * 512), 0usize..6000], 1..=3)
                    .boxed(),
            };
            lens.prop_map(move |lens| Case { write, offset, num_blocks, lens, seed })
        },
    )
}

#[test]
fn random_requests_succeed_iff_in_range_and_sized() {
    let e = engine(1, ReactorMode::Adaptive);
    const NAME: &str = "checks_proptest";
    malloc_bdev(NAME, PROP_BLOCKS, 512);
    // Every case starts from this content, so that cases (and shrinking) do not depend on history.
    let base = pattern(0xba5e, PROP_BLOCKS as usize * 512);
    let mut runner = TestRunner::new(Config { cases: 64, failure_persistence: None, ..Config::default() });
    let result = runner.run(&case_strategy(), |c| {
        let in_range = c.num_blocks > 0 && c.offset.checked_add(c.num_blocks).is_some_and(|end| end <= PROP_BLOCKS);
        let sized = c.lens.iter().all(|l| l % 512 == 0) && c.lens.iter().sum::<usize>() as u64 == c.num_blocks * 512;
        let want = if !in_range {
            IoStatus::OutOfRange
        } else if !sized {
            IoStatus::Misaligned
        } else {
            IoStatus::Success
        };
        let data = pattern(c.seed, c.lens.iter().sum());
        let (cc, d, b) = (c.clone(), data.clone(), base.clone());
        let (status, got, disk) = run(&e, 0, move || async move {
            let desc = Bdev::open(NAME, true, || {}).unwrap();
            let ch = desc.channel().unwrap();
            io_ok(&ch, IoRequest::write(0, PROP_BLOCKS, buf_from(&b))).await;
            let bufs =
                if cc.write { bufs_from(&d, &cc.lens) } else { cc.lens.iter().map(|&n| buf_filled(n, 0xee)).collect() };
            let t = if cc.write { IoType::Write } else { IoType::Read };
            let done = io(&ch, vectored(t, cc.offset, cc.num_blocks, bufs)).await;
            let got = payload(&done);
            let disk = io_ok(&ch, IoRequest::read(0, PROP_BLOCKS, alloc_buf(PROP_BLOCKS as usize * 512))).await;
            (done.status, got, disk)
        });
        prop_assert_eq!(status, want, "{:?}", c);
        let mut model = base.clone();
        let range = || (c.offset * 512) as usize..((c.offset + c.num_blocks) * 512) as usize;
        if c.write {
            prop_assert!(got == data, "the write payload changed");
            if status == IoStatus::Success {
                model[range()].copy_from_slice(&data);
            }
        } else if status == IoStatus::Success {
            prop_assert!(got == model[range()], "read returned the wrong data for {:?}", c);
        } else {
            prop_assert!(got.iter().all(|&b| b == 0xee), "a rejected read touched its buffers");
        }
        if disk != model {
            return Err(TestCaseError::fail(format!("bdev content differs from the model after {c:?}")));
        }
        Ok(())
    });
    unregister(NAME, None).unwrap();
    shutdown(e);
    if let Err(err) = result {
        panic!("{err}");
    }
}
