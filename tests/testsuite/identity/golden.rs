//! Golden vectors: the identity encoding is stable forever.
//!
//! Every vector was computed outside Rust, from the specification in
//! `idem-runtime/src/identity.rs` (Python's `hashlib.sha1` over the bytes the
//! spec describes), so these tests pin the encoding, not just this code.
//!
//! **Never edit a vector.** A changed encoding gives every past action a new
//! address, so every settled action would run once more. A new encoding needs
//! a new version byte after the magic and a migration story.

use idem::{Identity, KeyPart, PartWriter, PartWritten};

struct Vector {
    name: &'static str,
    identity: fn() -> Identity,
    address: &'static str,
    /// The canonical encoding in hex, for the short ones.
    canonical: Option<&'static str>,
}

/// A UUID written through the public writer, so this runs without the `uuid` feature.
struct RawUuid([u8; 16]);

impl KeyPart for RawUuid {
    fn write_key_part(&self, out: PartWriter<'_>) -> PartWritten {
        out.uuid(self.0)
    }
}

const UUID: [u8; 16] = [
    0x67, 0xe5, 0x50, 0x44, 0x10, 0xb1, 0x42, 0x6f, 0x92, 0x47, 0xbb, 0x68, 0x0e, 0x5f, 0xe0, 0xc8,
];

const VECTORS: &[Vector] = &[
    Vector {
        name: "action only",
        identity: || Identity::new("charge"),
        address: "claim_2b1db7bc493e6b3c20fcb5e9",
        canonical: Some("6964656d01610000000000000006636861726765"),
    },
    Vector {
        name: "one text part",
        identity: || Identity::new("charge").part("ord_1001"),
        address: "claim_70bd255d5922663a431fe2c6",
        canonical: Some(
            "6964656d016100000000000000066368617267657300000000000000086f72645f31303031",
        ),
    },
    Vector {
        name: "text and integer",
        identity: || Identity::new("charge").part("ord_1001").part(4999_i64),
        address: "claim_105fbd0d61b9070bb7097355",
        canonical: Some(
            "6964656d016100000000000000066368617267657300000000000000086f72645f313030316900000000000000043439\
             3939",
        ),
    },
    Vector {
        name: "empty action, empty part",
        identity: || Identity::new("").part(""),
        address: "claim_fbba9418866dfff1d7babf8a",
        canonical: Some("6964656d01610000000000000000730000000000000000"),
    },
    Vector {
        name: "(\"ab\", \"c\")",
        identity: || Identity::new("a").part("ab").part("c"),
        address: "claim_e5235e69f538f007e2cebcf9",
        canonical: Some("6964656d0161000000000000000161730000000000000002616273000000000000000163"),
    },
    Vector {
        name: "(\"a\", \"bc\")",
        identity: || Identity::new("a").part("a").part("bc"),
        address: "claim_726e0e756129cdc56ab70ea9",
        canonical: Some("6964656d0161000000000000000161730000000000000001617300000000000000026263"),
    },
    Vector {
        name: "separators inside a part",
        identity: || Identity::new("a").part("x,y|z:\x1f;"),
        address: "claim_b3754082459cb2400dc0e5da",
        canonical: Some("6964656d0161000000000000000161730000000000000008782c797c7a3a1f3b"),
    },
    Vector {
        name: "NUL characters",
        identity: || Identity::new("a").part("\0").part("a\0b"),
        address: "claim_5cb86c73821c8718a59c8779",
        canonical: Some(
            "6964656d016100000000000000016173000000000000000100730000000000000003610062",
        ),
    },
    Vector {
        name: "raw bytes with NUL and 0xff",
        identity: || Identity::new("a").part(&b"\x00\xff\x00"[..]),
        address: "claim_4a524c73c97d868b477fa762",
        canonical: Some("6964656d016100000000000000016162000000000000000300ff00"),
    },
    Vector {
        name: "non-ASCII",
        identity: || Identity::new("paiement").part("café ☕ 日本 🦀"),
        address: "claim_8a4e9d249c5175268f19b017",
        canonical: Some(
            "6964656d01610000000000000008706169656d656e74730000000000000015636166c3a920e2989520e697\
             a5e69cac20f09fa680",
        ),
    },
    Vector {
        name: "negative integer",
        identity: || Identity::new("a").part(-42_i8),
        address: "claim_1ac21f1b69160fec2f82be58",
        canonical: Some("6964656d01610000000000000001616900000000000000032d3432"),
    },
    Vector {
        name: "zero",
        identity: || Identity::new("a").part(0_u64),
        address: "claim_987fb8725445a380828972eb",
        canonical: Some("6964656d016100000000000000016169000000000000000130"),
    },
    Vector {
        name: "i128::MIN",
        identity: || Identity::new("a").part(i128::MIN),
        address: "claim_3921abf2cbb80b226b174992",
        canonical: None,
    },
    Vector {
        name: "u128::MAX",
        identity: || Identity::new("a").part(u128::MAX),
        address: "claim_960b9f122dee78795fc7eaec",
        canonical: None,
    },
    Vector {
        name: "booleans",
        identity: || Identity::new("a").part(true).part(false),
        address: "claim_63ec06540028b2d84ebfa41e",
        canonical: Some("6964656d01610000000000000001617400000000000000010174000000000000000100"),
    },
    Vector {
        name: "UUID",
        identity: || Identity::new("a").part(RawUuid(UUID)),
        address: "claim_4c0045891090e08eea4f7aea",
        canonical: Some(
            "6964656d016100000000000000016175000000000000001067e5504410b1426f9247bb680e5fe0c8",
        ),
    },
    Vector {
        name: "1 MiB string",
        identity: || Identity::new("bulk").part("x".repeat(1 << 20)),
        address: "claim_b1870716c129e3306a2ddb17",
        canonical: None,
    },
];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn addresses_match_the_golden_vectors() {
    let mut wrong = Vec::new();
    for vector in VECTORS {
        let identity = (vector.identity)();
        if identity.address() != vector.address {
            wrong.push(format!(
                "{}: address {} != golden {}",
                vector.name,
                identity.address(),
                vector.address
            ));
        }
        if let Some(canonical) = vector.canonical
            && hex(identity.canonical()) != canonical
        {
            wrong.push(format!(
                "{}: canonical {} != golden {canonical}",
                vector.name,
                hex(identity.canonical())
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "the identity encoding changed; every settled action would run again:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn there_are_at_least_ten_distinct_vectors() {
    let mut addresses: Vec<_> = VECTORS.iter().map(|v| v.address).collect();
    addresses.sort_unstable();
    addresses.dedup();
    assert_eq!(addresses.len(), VECTORS.len());
    assert!(VECTORS.len() >= 10);
}

#[test]
fn every_address_is_claim_and_24_lowercase_hex() {
    for vector in VECTORS {
        let address = (vector.identity)().address();
        let digest = address.strip_prefix("claim_").unwrap_or_default();
        assert_eq!(digest.len(), 24, "{address}");
        assert!(
            digest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{address}"
        );
    }
}

#[test]
fn integer_vectors_hold_for_every_integer_type() {
    let golden = "claim_1ac21f1b69160fec2f82be58"; // -42
    for address in [
        Identity::new("a").part(-42_i16).address(),
        Identity::new("a").part(-42_i32).address(),
        Identity::new("a").part(-42_i64).address(),
        Identity::new("a").part(-42_i128).address(),
        Identity::new("a").part(-42_isize).address(),
    ] {
        assert_eq!(address, golden);
    }
    let zero = "claim_987fb8725445a380828972eb";
    assert_eq!(Identity::new("a").part(0_u8).address(), zero);
    assert_eq!(Identity::new("a").part(0_i32).address(), zero);
    assert_eq!(Identity::new("a").part(0_usize).address(), zero);
}

#[test]
fn references_options_and_owned_strings_encode_like_their_values() {
    let golden = "claim_70bd255d5922663a431fe2c6";
    let owned = String::from("ord_1001");
    assert_eq!(Identity::new("charge").part(&owned).address(), golden);
    let borrowed: &str = &owned;
    let twice: &&str = &borrowed;
    assert_eq!(Identity::new("charge").part(twice).address(), golden);
    assert_eq!(
        Identity::new("charge").part(Some("ord_1001")).address(),
        golden
    );
    assert_eq!(
        Identity::new("charge")
            .part(Box::<str>::from("ord_1001"))
            .address(),
        golden
    );
}

#[cfg(feature = "uuid")]
#[test]
fn uuid_feature_matches_the_uuid_vector() {
    let uuid = uuid::Uuid::from_bytes(UUID);
    assert_eq!(
        Identity::new("a").part(uuid).address(),
        "claim_4c0045891090e08eea4f7aea"
    );
}
