//! The runtime's modules form no import cycle: each one can be read knowing
//! only those below it (the reading path is guard → run → acquire → claim →
//! store). A module "uses" another when its code (not its comments) names
//! `crate::<other>`; tests inside a module count too.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Top-level module name → the top-level modules its code names.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = BTreeMap::new();
    let mut files = vec![src.clone()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            for entry in fs::read_dir(&path).expect("the runtime's src/ is readable") {
                files.push(entry.expect("a readable entry").path());
            }
            continue;
        }
        if path.extension().is_none_or(|ext| ext != "rs") || path.ends_with("lib.rs") {
            continue;
        }
        let relative = path.strip_prefix(&src).expect("under src/");
        let module = relative
            .components()
            .next()
            .and_then(|first| first.as_os_str().to_str())
            .map(|first| first.trim_end_matches(".rs").to_owned())
            .expect("a module name");
        let code = fs::read_to_string(&path).expect("a readable source file");
        let used: &mut BTreeSet<String> = graph.entry(module.clone()).or_default();
        for line in code.lines() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            for (at, _) in line.match_indices("crate::") {
                let rest = &line[at + "crate::".len()..];
                // `crate::a::…`, or a list `crate::{a, b::c}` on one line.
                let names: Vec<&str> = match rest.strip_prefix('{') {
                    Some(list) => list.split(['}', ',']).collect(),
                    None => vec![rest],
                };
                for name in names {
                    let name: String = name
                        .trim_start()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    // Names that are not modules (items re-exported at the
                    // root) are dropped below.
                    if !name.is_empty() && name != module {
                        used.insert(name);
                    }
                }
            }
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for used in graph.values_mut() {
        used.retain(|name| modules.contains(name));
    }
    graph
}

/// A cycle through `from`, if any: the path of modules back to it.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        graph: &BTreeMap<String, BTreeSet<String>>,
        module: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|on_path| on_path == module) {
            let mut cycle = path[start..].to_vec();
            cycle.push(module.to_owned());
            return Some(cycle);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_owned());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(cycle) = visit(graph, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(module.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|module| visit(graph, module, &mut Vec::new(), &mut done))
}

#[test]
fn the_runtime_modules_import_each_other_in_no_cycle() {
    let graph = graph();
    if let Some(cycle) = cycle(&graph) {
        panic!(
            "the runtime's modules import each other in a cycle: {}; a module must \
             only name modules below it (guard → run → acquire → claim → store)",
            cycle.join(" → ")
        );
    }
}

#[test]
fn the_reading_path_goes_down_from_the_guard_to_the_store() {
    let graph = graph();
    let uses = |from: &str, to: &str| graph.get(from).is_some_and(|used| used.contains(to));
    for (from, to) in [
        ("guard", "gate"),
        ("guard", "run"),
        ("run", "acquire"),
        ("acquire", "claim"),
        ("claim", "store"),
    ] {
        assert!(uses(from, to), "{from} should call into {to}: {graph:#?}");
    }
    // Below the store there is only vocabulary: the errors, the outcome a
    // slot records (`outcome`, a leaf), the canonical encoding
    // (`identity`, a leaf: a step's row is read back into its name with
    // it). Its tests against a real PostgreSQL are in the facade's
    // `tests/testsuite/store/`, and the tests' server in `idem-testing`.
    let store = graph.get("store").cloned().unwrap_or_default();
    let above: Vec<_> = store
        .iter()
        .filter(|name| !matches!(name.as_str(), "error" | "fault" | "identity" | "outcome"))
        .collect();
    assert!(
        above.is_empty(),
        "the store is the bottom layer: it names only the vocabulary (error, fault, identity, \
         outcome), but it names {above:?}"
    );
    let outcome = graph.get("outcome").cloned().unwrap_or_default();
    assert!(
        outcome.is_empty(),
        "outcome is vocabulary, a leaf below the store, but it names {outcome:?}"
    );
    // How text idem did not write is shown (the `idem` command, the
    // console, and `idem-testing` when it prints a URL) names nothing.
    let shown = graph.get("shown").cloned().unwrap_or_default();
    assert!(shown.is_empty(), "shown is a leaf, but it names {shown:?}");
}
