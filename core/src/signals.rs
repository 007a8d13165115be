//! Context signals a row records: the tools a call declared and the ones the model called, by
//! name, within budgets that keep a row inside one telemetry ring record. Below both the decision
//! (declared tools) and the response side (called tools), which share these rules.

/// The most declared or invoked tools a row records (the rest are counted in no rollup).
pub const MAX_TOOLS_RECORDED: usize = 128;
/// A row's declared tool names stop at this many bytes in all (about 40 typical names), the
/// called ones at [`INVOKED_NAME_BUDGET`]: a row must fit one telemetry ring record (2 KB),
/// or it goes to the worker's spool and that worker drains on its own event loop.
pub const DECLARED_NAME_BUDGET: usize = 1024;
pub const INVOKED_NAME_BUDGET: usize = 384;
/// The providers' own limit on a tool name; a row keeps no more of one.
const MAX_TOOL_NAME_BYTES: usize = 64;

/// `name` as a row records it: at most [`MAX_TOOL_NAME_BYTES`], cut at a character boundary.
#[must_use]
pub fn recorded_tool_name(name: &str) -> &str {
    if name.len() <= MAX_TOOL_NAME_BYTES {
        return name;
    }
    let mut end = MAX_TOOL_NAME_BYTES;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// Adds `name` (as recorded) to `names` unless it is there already or `budget` bytes in all
/// would be passed; false once the budget or [`MAX_TOOLS_RECORDED`] is reached.
pub fn record_tool_name<T>(
    names: &mut Vec<T>,
    name: &str,
    budget: usize,
    key: impl Fn(&T) -> &str,
    make: impl FnOnce(String) -> T,
) -> bool {
    let name = recorded_tool_name(name);
    if names.iter().any(|n| key(n) == name) {
        return true;
    }
    let used: usize = names.iter().map(|n| key(n).len()).sum();
    if names.len() == MAX_TOOLS_RECORDED || used + name.len() > budget {
        return false;
    }
    names.push(make(name.to_owned()));
    true
}
