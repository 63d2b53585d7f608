//! Properties of the CDB decoder: any bytes decode without panicking; a CDB within its row's
//! usage data is never refused for a reserved bit; any one bit outside it is refused as
//! INVALID FIELD IN CDB pointing at exactly that byte and bit; the fields come out as encoded.

use ferrite_scsi::cdb::{decode, op, Command, Rw, OPS};
use ferrite_scsi::sense::FieldPointer;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn any_bytes_decode_or_are_refused_with_sense(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
        match decode(&bytes) {
            Ok(c) => {
                let _ = c.data_out_len(512);
            }
            Err(f) => {
                prop_assert_eq!(f.sense.status, 2);
                prop_assert_eq!(f.sense.key, 5, "ILLEGAL REQUEST");
                prop_assert!(f.encode(true).as_slice().len() <= 28);
            }
        }
    }

    #[test]
    fn bits_within_the_usage_data_are_never_refused_as_reserved(row in 0..OPS.len(), seed in proptest::collection::vec(any::<u8>(), 16)) {
        let o = &OPS[row];
        let mut cdb: Vec<u8> = o.usage.iter().zip(&seed).map(|(m, s)| m & s).collect();
        cdb[0] = o.opcode;
        if let Some(sa) = o.sa {
            cdb[1] = (cdb[1] & !0x1f) | sa as u8;
        }
        if let Err(f) = decode(&cdb) {
            // Only the checks of field values (not of reserved bits) may refuse it: the
            // pointer never names a bit outside the usage data.
            if let Some(FieldPointer { byte, bit: Some(bit), .. }) = f.field {
                prop_assert!(o.usage[usize::from(byte)] & (1 << bit) != 0, "{:02x?}: {:?}", cdb, f);
            }
            prop_assert_ne!(f.sense.asc, 0x20, "a supported opcode");
        }
    }

    #[test]
    fn one_bit_outside_the_usage_data_is_pointed_at(row in 0..OPS.len(), k in any::<usize>()) {
        let o = &OPS[row];
        let outside: Vec<(usize, u8)> =
            (1..o.usage.len()).flat_map(|i| (0..8u8).map(move |b| (i, b))).filter(|&(i, b)| o.usage[i] & (1 << b) == 0).collect();
        prop_assume!(!outside.is_empty());
        let (byte, bit) = outside[k % outside.len()];
        let mut cdb = vec![0u8; o.usage.len()];
        cdb[0] = o.opcode;
        if let Some(sa) = o.sa {
            cdb[1] = sa as u8;
        }
        cdb[byte] |= 1 << bit;
        let f = decode(&cdb).unwrap_err();
        prop_assert_eq!((f.sense.asc, f.sense.ascq), (0x24, 0));
        prop_assert_eq!(f.field, Some(FieldPointer { in_cdb: true, byte: byte as u16, bit: Some(bit) }));
    }

    #[test]
    fn read_and_write_fields_round_trip(lba in any::<u64>(), blocks in any::<u32>(), fua in any::<bool>(), dpo in any::<bool>()) {
        let flags = u8::from(fua) << 3 | u8::from(dpo) << 4;
        let mut c16 = vec![op::WRITE_16, flags];
        c16.extend_from_slice(&lba.to_be_bytes());
        c16.extend_from_slice(&blocks.to_be_bytes());
        c16.extend_from_slice(&[0, 0]);
        prop_assert_eq!(decode(&c16).unwrap(), Command::Write(Rw { lba, blocks, fua, dpo }));
        prop_assert_eq!(decode(&c16).unwrap().data_out_len(4096), u64::from(blocks) * 4096);
        let (l32, b16) = (lba as u32, blocks as u16);
        let mut c10 = vec![op::READ_10, flags];
        c10.extend_from_slice(&l32.to_be_bytes());
        c10.push(0);
        c10.extend_from_slice(&b16.to_be_bytes());
        c10.push(0);
        prop_assert_eq!(decode(&c10).unwrap(), Command::Read(Rw { lba: u64::from(l32), blocks: u32::from(b16), fua, dpo }));
        let c6 = [op::READ_6, (lba >> 16) as u8 & 0x1f, (lba >> 8) as u8, lba as u8, blocks as u8, 0];
        let n = if blocks as u8 == 0 { 256 } else { u32::from(blocks as u8) };
        prop_assert_eq!(decode(&c6).unwrap(), Command::Read(Rw { lba: lba & 0x1f_ffff, blocks: n, fua: false, dpo: false }));
    }
}
