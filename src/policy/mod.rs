//! Approval policy: ordered rules, written in CEL, that decide a tool call
//! when it is requested: `allow` it (granted by the policy), `deny` it
//! (with a reason the model reads), or `require` what a human decision
//! needs (approvers, their groups, a timeout). The first rule whose `when`
//! is true decides; a call no rule matches follows its tool's settings.
//!
//! CEL comes from the `cel-interpreter` crate: a maintained Rust
//! implementation of the language Kubernetes admission and Google IAM
//! conditions use. It is guarded in [`cel`]: an expression is bounded in
//! size and nesting before it is parsed, and evaluated off the runtime's
//! threads with a cost budget shared by everything one call's review
//! evaluates, so no rule or grant condition can crash or stall the server;
//! one over the budget fails safe (the call waits for a person). The
//! engine evaluates a policy only when a call is requested and records the
//! outcome, with the rule's name and the policy file's sha256, as an
//! event: replaying a run never evaluates a policy again, so history does
//! not change when the policy does.

pub mod cel;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, RwLock};

use cel_interpreter::Value as Cel;
use serde::Deserialize;
use serde_json::Value;

use crate::domain::event::Nudging;
pub use cel::Budget;

/// What a rule's `when` may name.
pub const VARIABLES: [&str; 6] = ["tool", "args", "labels", "task", "started_by", "now"];
/// Most rules one policy may hold.
const MAX_RULES: usize = 256;
/// Most approvers a rule may require (as for tools).
const MAX_APPROVALS: u32 = 16;
/// Most reminders of one request.
pub const MAX_REMINDERS: u32 = 100;

/// A loaded policy: its rules, compiled, and the sha256 of the file.
pub struct Policy {
    pub sha256: String,
    rules: Vec<Rule>,
}

struct Rule {
    name: String,
    when: Condition,
    decide: Decide,
}

/// A CEL expression over a call's [`VARIABLES`], checked: within the
/// limits of [`cel`], it parses and names no other variable. A policy
/// rule's `when`, and a standing grant's condition.
#[derive(Clone)]
pub struct Condition {
    expression: Arc<cel::Expression>,
}

impl Condition {
    /// Checks and compiles `source`; the error says what is wrong or
    /// which limit it passes.
    pub fn compile(source: &str) -> Result<Condition, String> {
        let expression = cel::Expression::parse(source)?;
        let mut unknown: Vec<&str> = expression
            .variables()
            .filter(|v| !VARIABLES.contains(v) && !is_bound_in(source, v))
            .collect();
        unknown.sort_unstable();
        unknown.dedup();
        if !unknown.is_empty() {
            return Err(format!(
                "unknown variable {}; a rule sees {}",
                unknown.join(", "),
                VARIABLES.join(", ")
            ));
        }
        Ok(Condition {
            expression: Arc::new(expression),
        })
    }

    /// Whether the condition holds for a call; an error (a missing
    /// argument, a type mismatch, a value that is not a bool, the budget
    /// spent) says why it could not be told.
    pub fn evaluate(&self, facts: &CallFacts, budget: &Arc<Budget>) -> Result<bool, String> {
        first_true(std::slice::from_ref(self), facts, budget)
            .map(|first| first.is_some())
            .map_err(|(_, why)| why)
    }
}

/// The index of the first of `conditions` that holds for a call (None when
/// none does), or the index of the first that could not be told and why.
/// One trip to a CEL thread for all of them.
pub fn first_true(
    conditions: &[Condition],
    facts: &CallFacts,
    budget: &Arc<Budget>,
) -> Result<Option<usize>, (usize, String)> {
    if conditions.is_empty() {
        return Ok(None);
    }
    let expressions = conditions.iter().map(|c| c.expression.clone()).collect();
    cel::first_true(expressions, variables(facts), budget)
}

/// What a rule decides.
#[derive(Debug, Clone, PartialEq)]
pub enum Decide {
    Allow,
    Deny { reason: String },
    Require(Requirements),
}

/// What a human decision needs, where a rule sets it (None: the tool's).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Requirements {
    pub approvals_required: Option<u32>,
    pub approvers: Option<Vec<String>>,
    pub approval_timeout_s: Option<f64>,
    pub remind_after_s: Option<f64>,
    pub reminders: Option<u32>,
    pub escalate_after_s: Option<f64>,
    pub escalate_to: Option<Vec<String>>,
}

impl Requirements {
    /// The reminders and escalation of a request: the rule's where it sets
    /// them, else the tool's.
    pub fn nudging(&self, tool: Option<&Nudging>) -> Nudging {
        let tool = tool.cloned().unwrap_or_default();
        Nudging {
            remind_after_s: self.remind_after_s.unwrap_or(tool.remind_after_s),
            // A rule that sets remind_after_s alone means one reminder.
            reminders: self.reminders.unwrap_or(match self.remind_after_s {
                Some(_) => tool.reminders.max(1),
                None => tool.reminders,
            }),
            escalate_after_s: self.escalate_after_s.unwrap_or(tool.escalate_after_s),
            escalate_to: self.escalate_to.clone().unwrap_or(tool.escalate_to),
        }
    }
}

/// What a rule sees of a call.
pub struct CallFacts<'a> {
    pub tool: &'a str,
    pub arguments: &'a Value,
    pub labels: &'a BTreeMap<String, String>,
    pub task: &'a str,
    pub started_by: &'a str,
    pub now_ms: i64,
}

/// The outcome of evaluating a policy for one call.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// No rule matched: the tool's own settings apply.
    NoMatch,
    /// This rule matched and decides.
    Decided { rule: String, decide: Decide },
    /// This rule could not be evaluated (a missing argument, a type
    /// mismatch): the call waits for a human, with the tool's settings.
    Failed { rule: String, error: String },
}

/// The policy file, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default, rename = "rule")]
    rules: Vec<RuleSection>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSection {
    name: String,
    when: String,
    decide: String,
    reason: Option<String>,
    approvals_required: Option<u32>,
    approvers: Option<Vec<String>>,
    approval_timeout_s: Option<f64>,
    remind_after_s: Option<f64>,
    reminders: Option<u32>,
    escalate_after_s: Option<f64>,
    escalate_to: Option<Vec<String>>,
}

impl Policy {
    /// Reads and checks a policy file; the error names the rule and what is wrong.
    pub fn load(path: &Path) -> Result<Policy, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read policy file {}: {e}", path.display()))?;
        Policy::parse(&text).map_err(|e| format!("policy file {}: {e}", path.display()))
    }

    /// Parses and checks a policy: every rule compiles, names only known
    /// variables, and decides something that can be done.
    pub fn parse(text: &str) -> Result<Policy, String> {
        use sha2::Digest;
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.rules.len() > MAX_RULES {
            return Err(format!(
                "{} rules; a policy holds at most {MAX_RULES}",
                file.rules.len()
            ));
        }
        let mut names = HashSet::new();
        let rules = file
            .rules
            .into_iter()
            .enumerate()
            .map(|(i, section)| {
                let label = format!("rule {} ('{}')", i + 1, section.name);
                let rule = Rule::check(section).map_err(|e| format!("{label}: {e}"))?;
                if !names.insert(rule.name.clone()) {
                    return Err(format!("{label}: another rule has this name"));
                }
                Ok(rule)
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Policy {
            sha256: hex::encode(sha2::Sha256::digest(text.as_bytes())),
            rules,
        })
    }

    /// The first rule that matches the call decides; rules are evaluated
    /// within `budget`, and one that cannot be (the budget spent
    /// included) fails safe.
    pub fn evaluate(&self, facts: &CallFacts, budget: &Arc<Budget>) -> Verdict {
        let conditions: Vec<Condition> = self.rules.iter().map(|r| r.when.clone()).collect();
        match first_true(&conditions, facts, budget) {
            Ok(None) => Verdict::NoMatch,
            Ok(Some(i)) => Verdict::Decided {
                rule: self.rules[i].name.clone(),
                decide: self.rules[i].decide.clone(),
            },
            Err((i, error)) => Verdict::Failed {
                rule: self.rules[i].name.clone(),
                error,
            },
        }
    }

    pub fn rule_names(&self) -> Vec<&str> {
        self.rules.iter().map(|r| r.name.as_str()).collect()
    }
}

impl Rule {
    fn check(section: RuleSection) -> Result<Rule, String> {
        // The names RegisterWorker and the auth config take (groups come
        // from the auth config).
        name("name", &section.name)?;
        let when = Condition::compile(&section.when).map_err(|e| format!("when: {e}"))?;
        let misplaced = |field: &str, present: bool| match present {
            true => Err(format!(
                "{field} is only for decide = \"{}\"",
                owner_of(field)
            )),
            false => Ok(()),
        };
        let decide = match section.decide.as_str() {
            "allow" | "deny" => {
                let requirements = [
                    ("approvals_required", section.approvals_required.is_some()),
                    ("approvers", section.approvers.is_some()),
                    ("approval_timeout_s", section.approval_timeout_s.is_some()),
                    ("remind_after_s", section.remind_after_s.is_some()),
                    ("reminders", section.reminders.is_some()),
                    ("escalate_after_s", section.escalate_after_s.is_some()),
                    ("escalate_to", section.escalate_to.is_some()),
                ];
                for (field, present) in requirements {
                    misplaced(field, present)?;
                }
                if section.decide == "allow" {
                    misplaced("reason", section.reason.is_some())?;
                    Decide::Allow
                } else {
                    let reason = section
                        .reason
                        .unwrap_or_else(|| format!("denied by policy rule {}", section.name));
                    Decide::Deny { reason }
                }
            }
            "require" => {
                misplaced("reason", section.reason.is_some())?;
                if let Some(n) = section.approvals_required {
                    if n == 0 || n > MAX_APPROVALS {
                        return Err(format!(
                            "approvals_required: {n} is out of range: 1 to {MAX_APPROVALS}"
                        ));
                    }
                }
                for (field, groups) in [
                    ("approvers", &section.approvers),
                    ("escalate_to", &section.escalate_to),
                ] {
                    for group in groups.iter().flatten() {
                        name(field, group)?;
                    }
                }
                for (field, seconds) in [
                    ("approval_timeout_s", section.approval_timeout_s),
                    ("remind_after_s", section.remind_after_s),
                    ("escalate_after_s", section.escalate_after_s),
                ] {
                    if let Some(s) = seconds {
                        crate::seconds::APPROVAL_TIMEOUT
                            .check(s)
                            .map_err(|why| format!("{field}: {why}"))?;
                    }
                }
                if section.reminders.is_some_and(|n| n > MAX_REMINDERS) {
                    return Err(format!("reminders: at most {MAX_REMINDERS}"));
                }
                Decide::Require(Requirements {
                    approvals_required: section.approvals_required,
                    approvers: section.approvers,
                    approval_timeout_s: section.approval_timeout_s,
                    remind_after_s: section.remind_after_s,
                    reminders: section.reminders,
                    escalate_after_s: section.escalate_after_s,
                    escalate_to: section.escalate_to,
                })
            }
            other => {
                return Err(format!(
                    "decide: '{other}' is not one of allow, deny, require"
                ))
            }
        };
        Ok(Rule {
            name: section.name,
            when,
            decide,
        })
    }
}

/// A name as everywhere else in aaa (`domain::check::name`), with its error as text.
fn name(field: &str, text: &str) -> Result<(), String> {
    crate::domain::check::name(field, text).map_err(|e| e.to_string())
}

fn owner_of(field: &str) -> &'static str {
    match field {
        "reason" => "deny",
        _ => "require",
    }
}

/// Whether `name` is bound by a comprehension macro in `source`
/// (`args.items.all(i, i > 0)`): such a name is the macro's, not an input.
fn is_bound_in(source: &str, name: &str) -> bool {
    ["all", "exists", "exists_one", "map", "filter"]
        .iter()
        .any(|m| {
            source.match_indices(&format!(".{m}(")).any(|(at, found)| {
                let rest = source[at + found.len()..].trim_start();
                rest.strip_prefix(name)
                    .is_some_and(|after| after.trim_start().starts_with(','))
            })
        })
}

/// The variables a rule sees.
fn variables(facts: &CallFacts) -> cel::Variables {
    let labels: HashMap<String, String> = facts.labels.clone().into_iter().collect();
    let now = chrono::DateTime::from_timestamp_millis(facts.now_ms)
        .unwrap_or_default()
        .fixed_offset();
    vec![
        ("tool", Cel::from(facts.tool.to_string())),
        ("args", cel::value(facts.arguments)),
        ("labels", Cel::from(labels)),
        ("task", Cel::from(facts.task.to_string())),
        ("started_by", Cel::from(facts.started_by.to_string())),
        ("now", Cel::Timestamp(now)),
    ]
}

/// The policy a server runs with, and the file it came from; replaced
/// whole on reload.
pub struct PolicyHandle {
    pub file: std::path::PathBuf,
    current: RwLock<Arc<Policy>>,
}

impl std::fmt::Debug for PolicyHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyHandle")
            .field("file", &self.file)
            .field("sha256", &self.current().sha256)
            .finish()
    }
}

impl PolicyHandle {
    /// Loads the policy file; the error names the rule and what is wrong.
    pub fn load(file: &Path) -> Result<PolicyHandle, String> {
        Ok(PolicyHandle {
            file: file.to_path_buf(),
            current: RwLock::new(Arc::new(Policy::load(file)?)),
        })
    }

    pub fn current(&self) -> Arc<Policy> {
        self.current.read().expect("poisoned").clone()
    }

    /// Reads the file again; a file that does not check leaves the policy
    /// in force as it is.
    pub fn reload(&self) -> Result<Arc<Policy>, String> {
        let policy = Arc::new(Policy::load(&self.file)?);
        *self.current.write().expect("poisoned") = policy.clone();
        Ok(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const EXAMPLE: &str = r#"
[[rule]]
name = "small-payments"
when = 'tool == "wire_money" && args.amount < 100 && args.to in ["ACME", "Globex"]'
decide = "allow"

[[rule]]
name = "huge-payments"
when = 'tool == "wire_money" && args.amount > 10000'
decide = "require"
approvals_required = 2
approvers = ["finance"]

[[rule]]
name = "payments"
when = 'tool == "wire_money"'
decide = "require"
approvers = ["finance"]

[[rule]]
name = "no-weekend-deploys"
when = 'tool == "deploy" && now.getDayOfWeek() in [0, 6] && labels.env == "prod"'
decide = "deny"
reason = "no deploys at the weekend"
"#;

    fn verdict(
        policy: &Policy,
        tool: &str,
        args: Value,
        labels: &[(&str, &str)],
        now_ms: i64,
    ) -> Verdict {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        policy.evaluate(
            &CallFacts {
                tool,
                arguments: &args,
                labels: &labels,
                task: "t",
                started_by: "",
                now_ms,
            },
            &Budget::new(),
        )
    }

    fn rule(v: &Verdict) -> &str {
        match v {
            Verdict::Decided { rule, .. } | Verdict::Failed { rule, .. } => rule,
            Verdict::NoMatch => "",
        }
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let policy = Policy::parse(EXAMPLE).unwrap();
        let monday = 1_764_547_200_000; // 2025-12-01, a Monday
        let saturday = monday + 5 * 86_400_000;
        let payment = |amount: i64, to: &str| json!({"amount": amount, "to": to});
        assert_eq!(
            rule(&verdict(
                &policy,
                "wire_money",
                payment(50, "ACME"),
                &[],
                monday
            )),
            "small-payments"
        );
        assert_eq!(
            rule(&verdict(
                &policy,
                "wire_money",
                payment(50, "Evil"),
                &[],
                monday
            )),
            "payments"
        );
        let huge = verdict(&policy, "wire_money", payment(20_000, "ACME"), &[], monday);
        assert_eq!(
            huge,
            Verdict::Decided {
                rule: "huge-payments".into(),
                decide: Decide::Require(Requirements {
                    approvals_required: Some(2),
                    approvers: Some(vec!["finance".into()]),
                    ..Requirements::default()
                })
            }
        );
        let prod = [("env", "prod")];
        assert_eq!(
            rule(&verdict(&policy, "deploy", json!({}), &prod, saturday)),
            "no-weekend-deploys"
        );
        assert_eq!(
            verdict(&policy, "deploy", json!({}), &prod, monday),
            Verdict::NoMatch
        );
        assert_eq!(
            verdict(&policy, "lookup", json!({}), &[], monday),
            Verdict::NoMatch
        );
    }

    #[test]
    fn a_rule_that_cannot_be_evaluated_fails_safe_and_names_itself() {
        let policy = Policy::parse(EXAMPLE).unwrap();
        let Verdict::Failed { rule, error } = verdict(
            &policy,
            "wire_money",
            json!({"amount": "lots", "to": "ACME"}),
            &[],
            0,
        ) else {
            panic!("a string compared with an int")
        };
        assert_eq!(rule, "small-payments");
        assert!(!error.is_empty());
        let missing = verdict(&policy, "wire_money", json!({"to": "ACME"}), &[], 0);
        assert!(matches!(missing, Verdict::Failed { .. }), "{missing:?}");
    }

    #[test]
    fn bad_policies_are_refused_with_the_rule_and_the_reason() {
        let refused = |text: &str| Policy::parse(text).err().expect("refused");
        let rule = |body: &str| format!("[[rule]]\nname = \"r\"\n{body}");
        assert!(refused(&rule("when = 'tool ==' \ndecide = \"allow\""))
            .starts_with("rule 1 ('r'): when:"));
        assert!(refused(&rule("when = 'amount > 1'\ndecide = \"allow\""))
            .contains("unknown variable amount"));
        assert!(refused(&rule("when = 'true'\ndecide = \"maybe\""))
            .contains("not one of allow, deny, require"));
        assert!(
            refused(&rule("when = 'true'\ndecide = \"allow\"\nreason = \"x\""))
                .contains("reason is only for decide = \"deny\"")
        );
        assert!(refused(&rule(
            "when = 'true'\ndecide = \"require\"\napprovals_required = 0"
        ))
        .contains("approvals_required: 0"));
        assert!(
            refused(&rule("when = 'true'\ndecide = \"allow\"\ncolour = 1"))
                .contains("unknown field")
        );
        let twice = format!(
            "{}\n{}",
            rule("when = 'true'\ndecide = \"allow\""),
            rule("when = 'true'\ndecide = \"allow\"")
        );
        assert!(refused(&twice).contains("rule 2 ('r'): another rule has this name"));
        // A comprehension's own variable is not an unknown input.
        let ok = rule("when = 'args.items.all(i, i > 0)'\ndecide = \"allow\"");
        assert!(Policy::parse(&ok).is_ok(), "{:?}", Policy::parse(&ok).err());
    }
}
