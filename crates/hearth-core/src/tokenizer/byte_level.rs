//! GPT-2's byte ↔ printable-character table used by byte-level BPE vocabularies, and the
//! SentencePiece piece conventions (`▁` for space, `<0xAB>` byte tokens).

use std::collections::HashMap;
use std::sync::OnceLock;

/// Byte `b` is written in byte-level vocabularies as `char_of_byte()[b]`: printable Latin-1 bytes map
/// to themselves, the other 68 bytes to U+0100.. in order (GPT-2's `bytes_to_unicode`).
fn char_of_byte() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut next_extra = 256u32;
        for byte in 0..=255u8 {
            let printable = matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
            table[byte as usize] = if printable {
                char::from(byte)
            } else {
                let c = char::from_u32(next_extra).unwrap_or('\u{FFFD}');
                next_extra += 1;
                c
            };
        }
        table
    })
}

fn byte_of_char() -> &'static HashMap<char, u8> {
    static TABLE: OnceLock<HashMap<char, u8>> = OnceLock::new();
    TABLE.get_or_init(|| char_of_byte().iter().enumerate().map(|(b, &c)| (c, b as u8)).collect())
}

/// Raw bytes of a byte-level BPE piece. Characters outside the table (malformed vocabularies) are
/// kept as their UTF-8, like llama.cpp keeps them visible rather than dropping them.
pub fn byte_level_piece_bytes(piece: &str) -> Vec<u8> {
    let table = byte_of_char();
    let mut out = Vec::with_capacity(piece.len());
    for c in piece.chars() {
        match table.get(&c) {
            Some(&b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out
}

/// Byte-level form of raw bytes (used to build the byte fallback of byte-level models).
#[cfg(test)]
pub fn byte_level_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char_of_byte()[b as usize]).collect()
}

/// `<0xAB>` → 0xAB.
pub fn parse_byte_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// SentencePiece piece text → raw bytes: `▁` stands for a space.
pub fn spm_piece_bytes(piece: &str) -> Vec<u8> {
    piece.replace('\u{2581}', " ").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_table_matches_known_points() {
        // Values from GPT-2's bytes_to_unicode: space → 'Ġ' (U+0120), newline → 'Ċ' (U+010A).
        assert_eq!(char_of_byte()[b' ' as usize], 'Ġ');
        assert_eq!(char_of_byte()[b'\n' as usize], 'Ċ');
        assert_eq!(char_of_byte()[b'A' as usize], 'A');
        assert_eq!(char_of_byte()[0xA0], 'ł');
        assert_eq!(char_of_byte()[0xAD], 'Ń');
        assert_eq!(byte_level_piece_bytes("ĠhelloĊ"), b" hello\n");
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(byte_level_piece_bytes(&byte_level_encode(&all)), all);
    }

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xF0>"), Some(0xF0));
        assert_eq!(parse_byte_token("<0x0>"), None);
        assert_eq!(spm_piece_bytes("▁hi▁"), b" hi ");
    }
}
