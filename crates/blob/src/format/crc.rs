//! The CRC SPDK stores in the last 4 bytes of the super block and of every metadata page.

use super::PAGE_SIZE;

/// CRC32C (Castagnoli) of the first 4092 bytes of a 4 KiB page, as SPDK computes it: seeded with
/// all ones and inverted at the end, i.e. the standard CRC-32C of those bytes.
///
/// `page` must hold at least [`PAGE_SIZE`] bytes; only the first `PAGE_SIZE - 4` are covered.
pub fn page_crc(page: &[u8]) -> u32 {
    crc32c::crc32c(&page[..PAGE_SIZE - 4])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_value() {
        // The standard CRC-32C check value ("123456789" -> 0xe3069283) carries over: the covered
        // bytes are the whole input of the CRC.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let zero = [0u8; PAGE_SIZE];
        assert_eq!(page_crc(&zero), crc32c::crc32c(&zero[..PAGE_SIZE - 4]));
        let mut other = zero;
        other[PAGE_SIZE - 1] = 0xff; // the crc field itself is not covered
        assert_eq!(page_crc(&other), page_crc(&zero));
    }
}
