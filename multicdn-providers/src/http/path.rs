//! Building request paths from outside data: every value placed in a path is percent-encoded,
//! so a tag or an id can never change which endpoint is called.

/// Percent-encodes `value` as one path segment: everything but the unreserved characters
/// (`A-Z a-z 0-9 - . _ ~`) becomes `%XX`.
pub fn encode_segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(hex(b >> 4));
            out.push(hex(b & 0x0f));
        }
    }
    out
}

fn hex(nibble: u8) -> char {
    char::from(if nibble < 10 {
        b'0' + nibble
    } else {
        b'A' + nibble - 10
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keeps_unreserved_and_encodes_the_rest() {
        assert_eq!(encode_segment("product-123_a.b~c"), "product-123_a.b~c");
        assert_eq!(encode_segment("a/b c?d#e%"), "a%2Fb%20c%3Fd%23e%25");
        assert_eq!(encode_segment("é"), "%C3%A9");
    }

    proptest! {
        #[test]
        fn an_encoded_segment_never_leaves_its_segment(s in ".*") {
            let e = encode_segment(&s);
            prop_assert!(!e.contains('/') && !e.contains('?') && !e.contains('#'));
            prop_assert!(e.is_ascii());
        }
    }
}
