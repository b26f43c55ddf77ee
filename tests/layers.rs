//! The import graph between the crate's top-level modules (`src/<name>.rs` or `src/<name>/`)
//! has no cycle, and the pure state machine imports nothing that does IO
//! (docs/architecture.md, "Invariants"). Read from the source: every `crate::<module>` a
//! module's non-test code names is an edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every `.rs` file under `dir`, except unit-test files (`tests.rs`, `tests/`): tests may
/// reach anywhere.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "tests" {
                sources(&path, found);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            found.push(path);
        }
    }
}

/// The non-test code of a file: without its comments (a doc naming `crate::x` imports
/// nothing) and without its inline test modules (`#[cfg(test)]` then `mod … {`, to the
/// brace that closes it). Other `#[cfg(test)]` items (a test-only method) stay: they are
/// few, and counting their imports can only show an edge too many.
fn code_of(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            continue;
        }
        let test_module = trimmed.starts_with("#[cfg(test)]")
            && lines.peek().is_some_and(|next| {
                let next = next.trim_start();
                (next.starts_with("mod ") || next.starts_with("pub(crate) mod "))
                    && next.trim_end().ends_with('{')
            });
        if test_module {
            let mut depth = 0usize;
            for inner in lines.by_ref() {
                depth += inner.matches('{').count();
                depth = depth.saturating_sub(inner.matches('}').count());
                if depth == 0 {
                    break;
                }
            }
            continue;
        }
        code.push_str(line);
        code.push('\n');
    }
    code
}

/// The module names that follow `crate::` in `code`.
fn named_modules(code: &str) -> BTreeSet<String> {
    code.match_indices("crate::")
        .map(|(at, _)| {
            code[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

fn import_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src/");
        let top = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .expect("a first component")
            .trim_end_matches(".rs")
            .to_owned();
        if top == "lib" || top == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let targets = named_modules(&code_of(&text));
        let edges = graph.entry(top.clone()).or_default();
        edges.extend(targets.into_iter().filter(|target| *target != top));
    }
    graph
}

/// A cycle through `from`, if the graph has one reachable from it.
fn cycle_from(graph: &Graph, from: &str) -> Option<Vec<String>> {
    fn visit(
        graph: &Graph,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|seen| seen == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(graph, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    visit(graph, from, &mut Vec::new(), &mut BTreeSet::new())
}

#[test]
fn the_top_level_modules_import_one_another_without_a_cycle() {
    let graph = import_graph();
    assert!(
        graph.contains_key("node") && graph.contains_key("raft"),
        "the graph was not read: {graph:?}"
    );
    for module in graph.keys() {
        if let Some(cycle) = cycle_from(&graph, module) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_state_machine_imports_only_pure_modules() {
    let graph = import_graph();
    let state = graph.get("state").expect("src/state/");
    let pure: BTreeSet<String> = ["codec", "contract", "limits"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    let impure: Vec<&String> = state.difference(&pure).collect();
    assert!(impure.is_empty(), "state/ imports {impure:?}");
}

#[test]
fn the_reader_skips_comments_and_test_modules_but_not_test_only_items() {
    let text = "//! See `crate::raft` for more.\n\
                use crate::state::Command;\n\
                impl X {\n\
                    #[cfg(test)]\n\
                    fn only_in_tests() { crate::clock::now(); }\n\
                }\n\
                #[cfg(test)]\n\
                mod tests {\n\
                    use crate::node::Node;\n\
                    fn f() { if true { crate::api::x(); } }\n\
                }\n\
                fn after() { crate::codec::decode(); }\n";
    assert_eq!(
        named_modules(&code_of(text)),
        BTreeSet::from(["clock".to_owned(), "codec".to_owned(), "state".to_owned()])
    );
}

#[test]
fn the_reader_sees_an_edge_and_a_cycle() {
    let code = "use crate::raft::NodeId;\nfn f() { crate::state::rules::apply(); }";
    assert_eq!(
        named_modules(code),
        BTreeSet::from(["raft".to_owned(), "state".to_owned()])
    );
    let graph: Graph = [("a", &["b"][..]), ("b", &["c"][..]), ("c", &["a"][..])]
        .into_iter()
        .map(|(node, to)| {
            (
                node.to_owned(),
                to.iter().map(|t| (*t).to_owned()).collect(),
            )
        })
        .collect();
    assert_eq!(
        cycle_from(&graph, "a"),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}
