//! Header names as Kafka carries them: any bytes, a NUL included. librdkafka hands names over as
//! C strings (cut at a NUL) and rdkafka's `OwnedHeaders::insert` takes them as `&str` (and
//! panics on a NUL), so both directions go through librdkafka's own calls here, with lengths.

use std::ffi::{c_char, c_void, CStr};

use rdkafka::bindings as rd;
use rdkafka::message::{BorrowedHeaders, OwnedHeaders};

/// The longest header name taken from librdkafka's header struct (a sanity bound: Kafka's own
/// limit on a record is far below what a name could claim).
const MAX_NAME: usize = 1 << 20;

/// The whole name of a header that `rd_kafka_header_get_all` returned as `name` (with `value`
/// and its `size`), NULs included.
///
/// librdkafka keeps each header in one allocation, `rd_kafka_header_t`: the serialised size,
/// the value size, the name size and the value pointer, then the name, a NUL, and the value
/// (with a NUL of its own). So a value pointer (when there is one) sits one byte past the
/// name's end, and otherwise the name size is the field just before the value pointer. Each
/// reading is checked against the others (the value's size and pointer, a NUL at the end) and
/// against the C string; anything that does not fit falls back to the C string.
///
/// # Safety
///
/// `name`, `value` and `size` are what `rd_kafka_header_get_all` returned for headers that
/// stay alive for `'a`.
pub(super) unsafe fn name_bytes<'a>(
    name: *const c_char,
    value: *const c_void,
    size: usize,
) -> &'a [u8] {
    // SAFETY: librdkafka's names are NUL-terminated.
    let shown = unsafe { CStr::from_ptr(name) }.to_bytes();
    let full = if value.is_null() {
        // SAFETY: the three fields before the name are the value size, the name size and the
        // value pointer of the same struct (see above), all `usize`-aligned.
        let fields = unsafe { name.cast::<usize>().sub(3) };
        let (value_size, name_size, value_ptr) = unsafe {
            (
                fields.read(),
                fields.add(1).read(),
                fields.add(2).cast::<*const c_void>().read(),
            )
        };
        (value_size == 0 && value_ptr.is_null()).then_some(name_size)
    } else {
        (value as usize).checked_sub(name as usize + 1)
    };
    match full {
        // SAFETY: the name's allocation holds `len` bytes and a NUL (checked to be there).
        Some(len) if len > shown.len() && len <= MAX_NAME && size <= isize::MAX as usize => {
            if unsafe { *name.add(len) } == 0 {
                unsafe { std::slice::from_raw_parts(name.cast::<u8>(), len) }
            } else {
                shown
            }
        }
        _ => shown,
    }
}

/// Headers whose names are any bytes (a NUL included), in order.
pub(super) fn owned<'h>(
    headers: impl IntoIterator<Item = (&'h [u8], Option<&'h [u8]>)>,
    capacity: usize,
) -> OwnedHeaders {
    let owned = OwnedHeaders::new_with_capacity(capacity.max(1));
    // `as_borrowed` is a pointer cast of the native headers object: this is that pointer.
    let native = owned.as_borrowed() as *const BorrowedHeaders as *mut rd::rd_kafka_headers_t;
    for (name, value) in headers {
        let (value_ptr, value_len) = match value {
            Some(v) => (v.as_ptr().cast::<c_void>(), v.len() as isize),
            None => (std::ptr::null(), 0),
        };
        // SAFETY: `native` is the live headers object owned by `owned`, which nothing else
        // references; librdkafka copies `name.len()` bytes of name and `value_len` of value.
        let err = unsafe {
            rd::rd_kafka_header_add(
                native,
                name.as_ptr().cast(),
                name.len() as isize,
                value_ptr,
                value_len,
            )
        };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            tracing::warn!(target: "inoutbox::kafka", "a header could not be added: {err:?}");
        }
    }
    owned
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every header of `headers`, names read as the consumer reads them.
    fn read_back(headers: &OwnedHeaders) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let list = headers.as_borrowed() as *const BorrowedHeaders as *const rd::rd_kafka_headers_t;
        // SAFETY: `list` is the live headers object of `headers`.
        let count = unsafe { rd::rd_kafka_header_cnt(list) };
        (0..count)
            .map(|idx| {
                let mut name: *const c_char = std::ptr::null();
                let mut value: *const c_void = std::ptr::null();
                let mut size = 0usize;
                // SAFETY: `idx < count`; the out-pointers are valid locals.
                let err = unsafe {
                    rd::rd_kafka_header_get_all(list, idx, &mut name, &mut value, &mut size)
                };
                assert_eq!(err, rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
                // SAFETY: as returned by `rd_kafka_header_get_all`, alive with `headers`.
                let name = unsafe { name_bytes(name, value, size) }.to_vec();
                let value = (!value.is_null()).then(|| {
                    unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec()
                });
                (name, value)
            })
            .collect()
    }

    #[test]
    fn header_names_with_a_nul_are_read_whole() {
        let headers: Vec<(&[u8], Option<&[u8]>)> = vec![
            (b"ce_id", Some(b"1")),
            (b"a\0b", Some(b"with a value")),
            (b"c\0d\0", None),
            (b"\0", Some(b"")),
            (b"x-\\xff", Some(b"\xff")),
            (b"plain", None),
        ];
        let owned = owned(headers.iter().copied(), headers.len());
        let back = read_back(&owned);
        let expected: Vec<(Vec<u8>, Option<Vec<u8>>)> = headers
            .iter()
            .map(|(n, v)| (n.to_vec(), v.map(<[u8]>::to_vec)))
            .collect();
        assert_eq!(back, expected);
    }
}
