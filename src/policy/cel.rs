//! CEL, guarded: the only place an expression a client or a policy file
//! wrote is parsed or evaluated.
//!
//! The interpreter (`cel-interpreter`, over `cel-parser`'s ANTLR parser)
//! recurses once or more per level of nesting and has no notion of cost,
//! so on its own a 1 KB expression of nested brackets overflows a thread's
//! stack (the process aborts) and three nested comprehensions over a
//! 300-element list run for seconds. Three guards make it safe to hand it
//! anything:
//! - **Bounded before parsing**: at most [`MAX_SOURCE_BYTES`] and
//!   [`MAX_NESTING`] brackets deep, found by a scan that knows CEL's
//!   strings and comments; after parsing, a tree at most [`MAX_DEPTH`]
//!   deep (operator chains nest too), measured without recursion.
//! - **A cost budget**: each comprehension (`all`, `exists`, `exists_one`,
//!   `map`, `filter`) is rewritten to charge a shared [`Budget`] one step
//!   per element, plus the length of the list it builds (`map` and
//!   `filter` copy it each step). Past [`STEP_BUDGET`] steps, or
//!   [`TIME_BUDGET`] of wall time as a backstop, the evaluation stops with
//!   an error, and the caller fails safe (the call waits for a person).
//!   Steps make the outcome the same on every machine; the clock bounds
//!   what steps do not count (one comparison of two long lists).
//! - **Its own threads**: parsing, and the evaluation of any expression
//!   with a comprehension or deeper than [`INLINE_DEPTH`], run on
//!   [`THREADS`] threads with a large stack, never on the runtime's; a
//!   caller on the runtime hands its other tasks over while it waits
//!   (`block_in_place`), so other runs go on. A shallow expression without
//!   a loop is evaluated where it is asked (its cost is bounded by its size
//!   and its input's). A panic of the interpreter is caught either way.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cel_interpreter::objects::{Key, Map};
use cel_interpreter::{Context, ExecutionError, Value as Cel};
use cel_parser::ast::{operators, CallExpr, EntryExpr, Expr, IdedEntryExpr, IdedExpr};

/// Longest expression, in bytes.
pub const MAX_SOURCE_BYTES: usize = 4096;
/// Deepest nesting of `(`, `[` and `{`.
pub const MAX_NESTING: usize = 32;
/// Deepest parsed tree: brackets, operator chains (`a + b + c` is a tree
/// as deep as it is long) and member paths all count.
pub const MAX_DEPTH: usize = 128;
/// Comprehension steps one review of a call may spend, over every rule and
/// grant condition it evaluates.
pub const STEP_BUDGET: u64 = 100_000;
/// Wall time one review of a call may spend evaluating.
pub const TIME_BUDGET: Duration = Duration::from_millis(50);
/// Threads that parse and evaluate.
pub const THREADS: usize = 2;
/// Deepest tree evaluated on the caller's thread when it has no
/// comprehension: its cost is bounded by its size and its input's, and
/// its recursion fits a runtime thread's stack (2 MiB) in a debug build
/// (see the test `shallow_expressions_fit_a_runtime_threads_stack`).
pub const INLINE_DEPTH: usize = 32;
/// Their stack: deep enough for any tree a 4 KiB source can make, even if
/// the scan and the parser disagreed about a bracket.
const STACK_BYTES: usize = 256 << 20;
/// The function a rewritten comprehension calls each step; a name no
/// source can spell (`@` starts no identifier).
const STEP: &str = "@aaa.step";

/// A parsed expression, within the limits and rewritten to charge a
/// budget. Variables are checked by the caller.
#[derive(Debug)]
pub struct Expression {
    tree: IdedExpr,
    /// Names bound by comprehensions, with the variables read.
    variables: Vec<String>,
    /// Cheap and shallow enough to evaluate on the caller's thread: no
    /// comprehension, and at most [`INLINE_DEPTH`] deep.
    inline: bool,
}

impl Expression {
    /// Checks `source` against the limits, parses it on a CEL thread and
    /// rewrites it; the error says which limit or what is wrong.
    pub fn parse(source: &str) -> Result<Expression, String> {
        if source.len() > MAX_SOURCE_BYTES {
            return Err(format!(
                "{} bytes, more than the limit of {MAX_SOURCE_BYTES}",
                source.len()
            ));
        }
        let nesting = nesting(source);
        if nesting > MAX_NESTING {
            return Err(format!(
                "brackets nest {nesting} deep, more than the limit of {MAX_NESTING}"
            ));
        }
        let source = source.to_string();
        on_cel_thread(move || {
            let tree = cel_parser::Parser::new()
                .parse(&source)
                .map_err(|e| e.to_string())?;
            let depth = depth(&tree);
            if depth > MAX_DEPTH {
                return Err(format!(
                    "nests {depth} deep (operators and member paths count), more than the limit of {MAX_DEPTH}"
                ));
            }
            let variables = tree
                .references()
                .variables()
                .into_iter()
                .map(String::from)
                .collect();
            let inline = depth <= INLINE_DEPTH && !has_comprehension(&tree);
            Ok(Expression {
                tree: metered(tree),
                variables,
                inline,
            })
        })?
    }

    /// The variables the expression reads (a comprehension's own included).
    pub fn variables(&self) -> impl Iterator<Item = &str> {
        self.variables.iter().map(String::as_str)
    }
}

/// What one review of a call may still spend.
#[derive(Debug)]
pub struct Budget {
    /// Set when a charge failed: the interpreter turns some errors into
    /// others (`size(x)` answers "missing argument" when `x` failed), so
    /// the outcome of an evaluation that ran out is read from here.
    exceeded: AtomicBool,
    steps: u64,
    steps_left: AtomicU64,
    time: Duration,
    deadline: Instant,
}

impl Budget {
    /// A fresh budget of [`STEP_BUDGET`] steps and [`TIME_BUDGET`].
    pub fn new() -> Arc<Budget> {
        Budget::with(STEP_BUDGET, TIME_BUDGET)
    }

    pub fn with(steps: u64, time: Duration) -> Arc<Budget> {
        Arc::new(Budget {
            exceeded: AtomicBool::new(false),
            steps,
            steps_left: AtomicU64::new(steps),
            time,
            deadline: Instant::now() + time,
        })
    }

    fn charge(&self, steps: u64) -> Result<(), String> {
        let charged = self.take(steps);
        if charged.is_err() {
            self.exceeded.store(true, Ordering::Relaxed);
        }
        charged
    }

    fn take(&self, steps: u64) -> Result<(), String> {
        let left = self.steps_left.load(Ordering::Relaxed);
        if left < steps {
            self.steps_left.store(0, Ordering::Relaxed);
            return Err(self.over_steps());
        }
        self.steps_left.store(left - steps, Ordering::Relaxed);
        if Instant::now() > self.deadline {
            return Err(format!(
                "over the evaluation budget of {} ms",
                self.time.as_millis()
            ));
        }
        Ok(())
    }

    fn over_steps(&self) -> String {
        format!(
            "over the evaluation budget of {} comprehension steps",
            self.steps
        )
    }

    /// Why the budget is spent, if it is: a charge failed, the clock ran
    /// out, or no step is left.
    fn spent(&self) -> Option<String> {
        let exceeded =
            self.exceeded.load(Ordering::Relaxed) || self.steps_left.load(Ordering::Relaxed) == 0;
        match self.take(0) {
            Err(why) => Some(why),
            Ok(()) => exceeded.then(|| self.over_steps()),
        }
    }
}

/// The variables an evaluation sees, as CEL values.
pub type Variables = Vec<(&'static str, Cel)>;

/// Evaluates `expressions` in order, on a CEL thread, until one is true or
/// fails: answers the index of the first that is true (`Ok(None)` when none
/// is), or the index of the first that could not be evaluated and why
/// (an error, a value that is not a bool, the budget spent).
pub fn first_true(
    expressions: Vec<Arc<Expression>>,
    variables: Variables,
    budget: &Arc<Budget>,
) -> Result<Option<usize>, (usize, String)> {
    // Most rules compare a few fields: handing them to a CEL thread would
    // cost more than evaluating them.
    if expressions.iter().all(|e| e.inline) {
        return evaluate(&expressions, variables, budget);
    }
    let budget = budget.clone();
    on_cel_thread(move || evaluate(&expressions, variables, &budget)).map_err(|why| (0, why))?
}

fn evaluate(
    expressions: &[Arc<Expression>],
    variables: Variables,
    budget: &Arc<Budget>,
) -> Result<Option<usize>, (usize, String)> {
    let mut context = Context::default();
    for (name, value) in variables {
        context.add_variable_from_value(name, value);
    }
    let meter = budget.clone();
    context.add_function(
        STEP,
        move |accumulated: Cel| -> Result<bool, ExecutionError> {
            let building = match &accumulated {
                Cel::List(items) => items.len() as u64,
                _ => 0,
            };
            meter
                .charge(1 + building)
                .map(|()| true)
                .map_err(|why| ExecutionError::function_error("budget", why))
        },
    );
    for (i, expression) in expressions.iter().enumerate() {
        if let Some(why) = budget.spent() {
            return Err((i, why));
        }
        let one = AssertUnwindSafe(|| context.resolve(&expression.tree));
        let outcome = std::panic::catch_unwind(one);
        if budget.exceeded.load(Ordering::Relaxed) {
            return Err((i, budget.spent().unwrap_or_else(|| budget.over_steps())));
        }
        match outcome {
            Ok(Ok(Cel::Bool(true))) => return Ok(Some(i)),
            Ok(Ok(Cel::Bool(false))) => {}
            Ok(Ok(other)) => return Err((i, format!("gave {other:?}, not a bool"))),
            Ok(Err(e)) => return Err((i, e.to_string())),
            Err(_) => return Err((i, "the CEL interpreter failed on this input".into())),
        }
    }
    Ok(None)
}

/// The deepest bracket nesting of `source`, outside strings and comments.
fn nesting(source: &str) -> usize {
    let bytes = source.as_bytes();
    let (mut depth, mut deepest, mut i) = (0usize, 0usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'(' | b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            quote @ (b'"' | b'\'') => {
                // A raw string (r"...", also after b) has no escapes.
                let raw = i > 0 && matches!(bytes[i - 1], b'r' | b'R');
                i = string_end(bytes, i, quote, raw);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    deepest
}

/// The index just past the string literal that opens at `start`.
fn string_end(bytes: &[u8], start: usize, quote: u8, raw: bool) -> usize {
    let triple = bytes[start..].starts_with(&[quote; 3]);
    let (mut i, close) = match triple {
        true => (start + 3, 3),
        false => (start + 1, 1),
    };
    while i < bytes.len() {
        if bytes[i] == b'\\' && !raw {
            i += 2;
            continue;
        }
        if bytes[i..].starts_with(&[quote; 3][..close]) {
            return i + close;
        }
        // A one-quote string ends at a line's end (the parser refuses it).
        if !triple && (bytes[i] == b'\n' || bytes[i] == b'\r') {
            return i;
        }
        i += 1;
    }
    i
}

/// Does the tree loop (`all`, `exists`, `exists_one`, `map`, `filter`)?
fn has_comprehension(tree: &IdedExpr) -> bool {
    let mut stack = vec![tree];
    while let Some(node) = stack.pop() {
        if matches!(node.expr, Expr::Comprehension(_)) {
            return true;
        }
        stack.extend(children(node));
    }
    false
}

/// The depth of a parsed tree, walked with a stack of its own.
fn depth(tree: &IdedExpr) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(tree, 1usize)];
    while let Some((node, d)) = stack.pop() {
        deepest = deepest.max(d);
        for child in children(node) {
            stack.push((child, d + 1));
        }
    }
    deepest
}

fn children(node: &IdedExpr) -> Vec<&IdedExpr> {
    match &node.expr {
        Expr::Call(call) => call
            .target
            .as_deref()
            .into_iter()
            .chain(&call.args)
            .collect(),
        Expr::Comprehension(c) => vec![
            &*c.iter_range,
            &*c.accu_init,
            &*c.loop_cond,
            &*c.loop_step,
            &*c.result,
        ],
        Expr::List(list) => list.elements.iter().collect(),
        Expr::Map(map) => entries(&map.entries),
        Expr::Struct(s) => entries(&s.entries),
        Expr::Select(select) => vec![&*select.operand],
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => Vec::new(),
    }
}

/// The expressions of a map's or a struct's entries.
fn entries(entries: &[IdedEntryExpr]) -> Vec<&IdedExpr> {
    entries
        .iter()
        .flat_map(|e| match &e.expr {
            EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
            EntryExpr::StructField(f) => vec![&f.value],
        })
        .collect()
}

/// The tree with each comprehension's loop condition made
/// `@aaa.step(accumulator) && condition`: every step is charged before it
/// runs. (Only trees within [`MAX_DEPTH`] get here, so recursion is fine.)
fn metered(mut node: IdedExpr) -> IdedExpr {
    node.expr = match node.expr {
        Expr::Comprehension(mut c) => {
            let step = IdedExpr {
                id: 0,
                expr: Expr::Call(CallExpr {
                    func_name: STEP.to_string(),
                    target: None,
                    args: vec![IdedExpr {
                        id: 0,
                        expr: Expr::Ident(c.accu_var.clone()),
                    }],
                }),
            };
            let condition = metered(*c.loop_cond);
            c.loop_cond = Box::new(IdedExpr {
                id: 0,
                expr: Expr::Call(CallExpr {
                    func_name: operators::LOGICAL_AND.to_string(),
                    target: None,
                    args: vec![step, condition],
                }),
            });
            c.iter_range = Box::new(metered(*c.iter_range));
            c.accu_init = Box::new(metered(*c.accu_init));
            c.loop_step = Box::new(metered(*c.loop_step));
            c.result = Box::new(metered(*c.result));
            Expr::Comprehension(c)
        }
        Expr::Call(mut call) => {
            call.target = call.target.map(|t| Box::new(metered(*t)));
            call.args = call.args.into_iter().map(metered).collect();
            Expr::Call(call)
        }
        Expr::List(mut list) => {
            list.elements = list.elements.into_iter().map(metered).collect();
            Expr::List(list)
        }
        Expr::Map(mut map) => {
            for entry in &mut map.entries {
                if let EntryExpr::MapEntry(m) = &mut entry.expr {
                    m.key = metered(std::mem::take(&mut m.key));
                    m.value = metered(std::mem::take(&mut m.value));
                }
            }
            Expr::Map(map)
        }
        Expr::Select(mut select) => {
            select.operand = Box::new(metered(*select.operand));
            Expr::Select(select)
        }
        other => other,
    };
    node
}

type Job = Box<dyn FnOnce() + Send>;

/// The queue of the CEL threads, started on first use.
fn queue() -> &'static Mutex<mpsc::Sender<Job>> {
    static QUEUE: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    QUEUE.get_or_init(|| {
        let (send, receive) = mpsc::channel::<Job>();
        let receive = Arc::new(Mutex::new(receive));
        for n in 0..THREADS {
            let receive = receive.clone();
            std::thread::Builder::new()
                .name(format!("aaa-cel-{n}"))
                .stack_size(STACK_BYTES)
                .spawn(move || loop {
                    let job = receive.lock().expect("poisoned").recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                })
                .expect("a CEL thread starts");
        }
        Mutex::new(send)
    })
}

/// Runs `work` on a CEL thread and waits for its answer. On the runtime,
/// the waiting worker hands its other tasks to another thread first.
fn on_cel_thread<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (answer, answered) = mpsc::sync_channel(1);
    let job: Job = Box::new(move || {
        let result = std::panic::catch_unwind(AssertUnwindSafe(work));
        let _ = answer.send(result);
    });
    queue()
        .lock()
        .expect("poisoned")
        .send(job)
        .map_err(|_| "the CEL threads are gone".to_string())?;
    let wait = || answered.recv();
    let result = match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    };
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(_)) => Err("not a valid CEL expression (the parser gave up on it)".to_string()),
        Err(_) => Err("the CEL threads are gone".to_string()),
    }
}

/// A JSON value as CEL sees it: integers stay integers (int, or uint above
/// i64), other numbers are doubles.
pub fn value(json: &serde_json::Value) -> Cel {
    use serde_json::Value;
    match json {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Cel::Int(i),
            (None, Some(u)) => Cel::UInt(u),
            _ => Cel::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => Cel::String(Arc::new(s.clone())),
        Value::Array(items) => Cel::List(Arc::new(items.iter().map(value).collect())),
        Value::Object(fields) => {
            let map: HashMap<Key, Cel> = fields
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), value(v)))
                .collect();
            Cel::Map(Map { map: Arc::new(map) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(source: &str) -> String {
        Expression::parse(source).expect_err("refused")
    }

    fn run(source: &str, args: serde_json::Value) -> Result<Option<usize>, (usize, String)> {
        run_within(source, args, &Budget::new())
    }

    fn run_within(
        source: &str,
        args: serde_json::Value,
        budget: &Arc<Budget>,
    ) -> Result<Option<usize>, (usize, String)> {
        let expression = Arc::new(Expression::parse(source).expect("parses"));
        first_true(vec![expression], vec![("args", value(&args))], budget)
    }

    /// The deepest expressions evaluated on the caller's thread run on a
    /// thread with a runtime worker's stack (tokio's 2 MiB), in whatever
    /// build the tests are (a debug build's frames are the largest).
    #[test]
    fn shallow_expressions_fit_a_runtime_threads_stack() {
        let adds = format!(
            "{} == {}",
            vec!["args.x"; INLINE_DEPTH - 2].join(" + "),
            INLINE_DEPTH - 2
        );
        let brackets = format!(
            "size({}args.x{}) == 1",
            "[".repeat(INLINE_DEPTH - 4),
            "]".repeat(INLINE_DEPTH - 4)
        );
        let parens = format!(
            "{}args.x{} == 1",
            "(-".repeat(INLINE_DEPTH - 3),
            ")".repeat(INLINE_DEPTH - 3)
        );
        for source in [adds, brackets, parens] {
            let expression = Expression::parse(&source).expect("parses");
            assert!(expression.inline, "{source} is evaluated inline");
            let expression = Arc::new(expression);
            let evaluated = std::thread::Builder::new()
                .stack_size(2 << 20)
                .spawn(move || {
                    let args = value(&serde_json::json!({"x": 1}));
                    evaluate(&[expression], vec![("args", args)], &Budget::new())
                })
                .expect("a thread starts")
                .join()
                .expect("no overflow");
            assert!(evaluated.is_ok(), "{source}: {evaluated:?}");
        }
        let deeper = format!("{} == 1", vec!["args.x"; INLINE_DEPTH + 4].join(" + "));
        assert!(!Expression::parse(&deeper).expect("parses").inline);
        let looping = "args.l.all(x, x > 0)";
        assert!(!Expression::parse(looping).expect("parses").inline);
    }

    #[test]
    fn deep_nesting_is_refused_before_parsing_and_names_the_limit() {
        for (open, close) in [("(", ")"), ("[", "]"), ("{1:", "}")] {
            let deep = format!("{}1{}", open.repeat(500), close.repeat(500));
            let why = refused(&deep);
            assert!(why.contains("limit of 32"), "{why}");
        }
        let ok = format!("{}1{}", "(".repeat(MAX_NESTING), ")".repeat(MAX_NESTING));
        assert!(Expression::parse(&ok).is_ok());
        // Brackets in strings and comments are not nesting, and quotes in
        // comments open no string.
        let quoted = format!("'{}' == \"{}\"", "(".repeat(100), "[".repeat(100));
        assert!(
            Expression::parse(&quoted).is_ok(),
            "{:?}",
            Expression::parse(&quoted).err()
        );
        let hidden = format!("// \"\n{}1{}", "(".repeat(40), ")".repeat(40));
        assert!(refused(&hidden).contains("limit of 32"));
        let escaped = format!("'\\'' + {}'a'{}", "(".repeat(40), ")".repeat(40));
        assert!(refused(&escaped).contains("limit of 32"));
        assert!(refused(&"1".repeat(MAX_SOURCE_BYTES + 1)).contains("limit of 4096"));
    }

    #[test]
    fn long_chains_are_refused_after_parsing_without_overflowing() {
        for chain in [
            vec!["1"; 2000].join("+"),
            format!("{{}}{}", ".a".repeat(2000)),
            format!("{}1", "true?1:".repeat(580)),
        ] {
            let why = refused(&chain);
            assert!(why.contains("limit of 128"), "{why}");
        }
        // A long && chain is a list, not a tower: it is fine.
        assert!(Expression::parse(&vec!["true"; 500].join(" && ")).is_ok());
    }

    #[test]
    fn a_runaway_comprehension_stops_at_the_budget() {
        let list: Vec<i64> = (0..300).collect();
        let args = serde_json::json!({ "l": list });
        let started = Instant::now();
        let (_, why) = run(
            "args.l.all(x, args.l.all(y, args.l.all(z, x + y + z >= 0)))",
            args.clone(),
        )
        .expect_err("over budget");
        assert!(why.contains("over the evaluation budget"), "{why}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // Steps alone stop it, the same on every machine: one per element,
        // plus, for map and filter, the list built so far (copied each step).
        let hour = Duration::from_secs(3600);
        let steps = |source: &str, n: u64| {
            run_within(source, args.clone(), &Budget::with(n, hour)).map_err(|(_, why)| why)
        };
        let over = Err("over the evaluation budget of 1000 comprehension steps".to_string());
        assert_eq!(steps("args.l.all(x, args.l.all(y, y >= 0))", 1000), over);
        assert_eq!(steps("args.l.all(x, x >= 0)", 300), Ok(Some(0)));
        assert_eq!(
            steps("args.l.all(x, x >= 0)", 299).map(|_| ()),
            Err(over.clone().unwrap_err().replace("1000", "299"))
        );
        // map over 300 builds lists of 0..299 elements: 300 + 44,850 steps.
        let map = "args.l.map(x, x).size() == 300";
        assert_eq!(steps(map, 45_150), Ok(Some(0)));
        assert!(steps(map, 45_149).is_err());
        // An error the interpreter turns into another is still the budget's.
        let swallowed = steps("size(args.l.map(x, x)) == 300", 45_149);
        assert_eq!(
            swallowed,
            Err("over the evaluation budget of 45149 comprehension steps".into())
        );
        // An ordinary comprehension is well within it.
        assert_eq!(run("args.l.all(x, x >= 0)", args.clone()), Ok(Some(0)));
        assert_eq!(run("args.l.exists(x, x > 1000)", args), Ok(None));
    }

    #[test]
    fn one_budget_is_shared_by_every_expression_of_a_review() {
        let args = serde_json::json!({ "l": (0..1000).collect::<Vec<i64>>() });
        let heavy = Arc::new(Expression::parse("args.l.all(x, args.l.all(y, y >= 0))").unwrap());
        let light = Arc::new(Expression::parse("args.l.all(x, x >= 0)").unwrap());
        let budget = Budget::new();
        let first = first_true(vec![heavy], vec![("args", value(&args))], &budget);
        assert!(first.is_err());
        let then = first_true(vec![light], vec![("args", value(&args))], &budget);
        assert!(then.unwrap_err().1.contains("budget"));
    }

    #[test]
    fn comprehensions_still_mean_what_they_meant() {
        let args = serde_json::json!({ "l": [1, 2, 3], "m": {"a": 1} });
        for (source, expected) in [
            ("args.l.map(x, x * 2) == [2, 4, 6]", true),
            ("args.l.filter(x, x > 1) == [2, 3]", true),
            ("args.l.exists_one(x, x == 2)", true),
            ("args.l.exists(x, x == 4)", false),
            ("args.m.all(k, k == 'a')", true),
        ] {
            assert_eq!(
                run(source, args.clone()),
                Ok(expected.then_some(0)),
                "{source}"
            );
        }
    }
}
