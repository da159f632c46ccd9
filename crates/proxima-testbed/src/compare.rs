//! `proxima-testbed compare`: several runs' results side by side.
//!
//! Each directory given is one `run --out` directory; its `summary.csv` holds one row
//! per run (variant × strategy × repeat). A *scenario* here is a directory and variant
//! (`n50-seed1`, `n50-seed1 [alone]`); each strategy's share **of reach** (of the
//! requests some instance could have answered within the SLO, the share that was) is
//! one cell, the median over repeats when there are several. The table says, per
//! scenario, by how many points the strategy named `--lead` is ahead of the best other
//! one (negative: behind), and the host's runtime lag, so that a noisy run shows as one.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::TestbedError;

/// One row of a `summary.csv`, the fields the comparison reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    /// Directory name, with ` [variant]` when the run had one.
    pub scenario: String,
    /// The strategy's label, as in `--strategies`.
    pub label: String,
    /// Share of reach, in percent.
    pub of_reach: f64,
    /// Share within the SLO, in percent.
    pub within_slo: f64,
    /// Services whose own percentile met their SLO, and services.
    pub services_met: (u32, u32),
    /// Services whose own percentile over their reachable requests met their SLO
    /// (`None` in results written before the column existed).
    pub services_met_where_reachable: Option<u32>,
    /// The runtime's p99 lag, ms.
    pub lag_p99_ms: f64,
    /// The highest 1-minute load average seen.
    pub load_max: Option<f64>,
}

/// The comparison of `cells` (see the module docs).
#[derive(Debug)]
pub struct Comparison {
    /// Scenarios in the order first seen.
    pub scenarios: Vec<String>,
    /// Strategy labels in the order first seen.
    pub labels: Vec<String>,
    /// `(scenario, label)` → the median cell over its repeats.
    pub cells: BTreeMap<(String, String), Cell>,
}

/// Split one CSV line written by `report::csv_field` (quotes only around fields with a
/// comma, a quote or a newline).
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                fields.last_mut().unwrap().push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(String::new()),
            _ => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

/// The cells of one `summary.csv` text, for runs in directory `name`.
pub fn read_summary(name: &str, text: &str) -> Result<Vec<Cell>, TestbedError> {
    let mut lines = text.lines();
    let header = csv_fields(lines.next().unwrap_or_default());
    let column = |key: &str| {
        header
            .iter()
            .position(|h| h == key)
            .ok_or_else(|| TestbedError::Invalid(format!("{name}/summary.csv: no column {key}")))
    };
    let [variant, label, reach, within, met, services, lag, load] = [
        "variant",
        "label",
        "reachable_share",
        "slo_share",
        "services_met",
        "services",
        "lag_p99_ms",
        "load_max",
    ]
    .map(column);
    let (variant, label, reach, within) = (variant?, label?, reach?, within?);
    let (met, services, lag, load) = (met?, services?, lag?, load?);
    let met_at_reach = column("services_met_where_reachable").ok();
    let number = |row: &[String], i: usize| -> Result<f64, TestbedError> {
        row.get(i).and_then(|v| v.parse().ok()).ok_or_else(|| {
            TestbedError::Invalid(format!("{name}/summary.csv: bad {:?}", header[i]))
        })
    };
    let mut cells = Vec::new();
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let row = csv_fields(line);
        let variant = row.get(variant).map_or("", String::as_str);
        let scenario = match variant {
            "" => name.to_string(),
            v => format!("{name} [{v}]"),
        };
        // A run's label is `<variant> <strategy>`: the variant is in the scenario.
        let label = row.get(label).map_or("", String::as_str);
        let label = label
            .strip_prefix(variant)
            .and_then(|l| l.strip_prefix(' '))
            .filter(|_| !variant.is_empty())
            .unwrap_or(label);
        cells.push(Cell {
            scenario,
            label: label.to_string(),
            of_reach: number(&row, reach)?,
            within_slo: number(&row, within)?,
            services_met: (number(&row, met)? as u32, number(&row, services)? as u32),
            services_met_where_reachable: met_at_reach
                .and_then(|i| number(&row, i).ok())
                .map(|n| n as u32),
            lag_p99_ms: number(&row, lag)?,
            load_max: number(&row, load).ok(),
        });
    }
    Ok(cells)
}

/// Strip the ` #k` a repeat adds to a label.
fn series_label(label: &str) -> &str {
    match label.rsplit_once(" #") {
        Some((base, k)) if k.chars().all(|c| c.is_ascii_digit()) => base,
        _ => label,
    }
}

/// Gather `cells` by scenario and label, the median of repeats (by share of reach).
pub fn compare(cells: Vec<Cell>) -> Comparison {
    let mut scenarios = Vec::new();
    let mut labels = Vec::new();
    let mut groups: BTreeMap<(String, String), Vec<Cell>> = BTreeMap::new();
    for cell in cells {
        let label = series_label(&cell.label).to_string();
        if !scenarios.contains(&cell.scenario) {
            scenarios.push(cell.scenario.clone());
        }
        if !labels.contains(&label) {
            labels.push(label.clone());
        }
        groups
            .entry((cell.scenario.clone(), label.clone()))
            .or_default()
            .push(Cell { label, ..cell });
    }
    let cells = groups
        .into_iter()
        .map(|(key, mut runs)| {
            runs.sort_by(|a, b| a.of_reach.total_cmp(&b.of_reach));
            // An even count has two middle runs: the share is their mean (the upper
            // one alone would favour whichever strategy had one lucky run of two),
            // and the lower one stands for the rest of the cell.
            let lower = (runs.len() - 1) / 2;
            let share = match runs.len() % 2 {
                0 => (runs[lower].of_reach + runs[lower + 1].of_reach) / 2.0,
                _ => runs[lower].of_reach,
            };
            let mut median = runs.swap_remove(lower);
            median.of_reach = share;
            (key, median)
        })
        .collect();
    Comparison {
        scenarios,
        labels,
        cells,
    }
}

impl Comparison {
    /// How many points of reach `lead` is ahead of the best other strategy in
    /// `scenario` (`None` when either is missing).
    pub fn margin(&self, scenario: &str, lead: &str) -> Option<f64> {
        let of = |label: &str| {
            self.cells
                .get(&(scenario.to_string(), label.to_string()))
                .map(|c| c.of_reach)
        };
        let best_other = self
            .labels
            .iter()
            .filter(|l| *l != lead)
            .filter_map(|l| of(l))
            .reduce(f64::max)?;
        Some(of(lead)? - best_other)
    }

    /// A Markdown table: a row per scenario, a column per strategy (share of reach, the
    /// best in bold, and the services meeting their percentile where reachable out of
    /// all, when the results say), then `lead`'s margin and the host's worst lag and
    /// load.
    pub fn markdown(&self, lead: &str) -> String {
        let mut out = String::from("| scenario |");
        for label in &self.labels {
            let _ = write!(out, " {label} |");
        }
        let _ = writeln!(out, " {lead} ahead by | lag p99 (worst run) | load (max) |");
        out.push_str("|---|");
        out.push_str(&"---:|".repeat(self.labels.len() + 3));
        out.push('\n');
        for scenario in &self.scenarios {
            let row: Vec<Option<&Cell>> = self
                .labels
                .iter()
                .map(|l| self.cells.get(&(scenario.clone(), l.clone())))
                .collect();
            let best = row.iter().flatten().map(|c| c.of_reach).reduce(f64::max);
            let _ = write!(out, "| {scenario} |");
            for cell in &row {
                let Some(c) = cell else {
                    out.push_str(" – |");
                    continue;
                };
                let share = format!("{:.1}%", c.of_reach);
                match Some(c.of_reach) == best {
                    true => {
                        let _ = write!(out, " **{share}**");
                    }
                    false => {
                        let _ = write!(out, " {share}");
                    }
                }
                if let Some(met) = c.services_met_where_reachable {
                    let _ = write!(out, " · {met}/{}", c.services_met.1);
                }
                out.push_str(" |");
            }
            let margin = self
                .margin(scenario, lead)
                .map_or("–".to_string(), |m| format!("{m:+.1}"));
            let lag = row.iter().flatten().map(|c| c.lag_p99_ms).reduce(f64::max);
            let load = row
                .iter()
                .flatten()
                .filter_map(|c| c.load_max)
                .reduce(f64::max);
            let _ = writeln!(
                out,
                " {margin} | {} | {} |",
                lag.map_or("–".to_string(), |l| format!("{l:.1} ms")),
                load.map_or("–".to_string(), |l| format!("{l:.2}")),
            );
        }
        out
    }

    /// The same cells as CSV, one row per scenario and strategy.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "scenario,label,of_reach,within_slo,services_met,services,lag_p99_ms,load_max,services_met_where_reachable\n",
        );
        for scenario in &self.scenarios {
            for label in &self.labels {
                if let Some(c) = self.cells.get(&(scenario.clone(), label.clone())) {
                    let _ = writeln!(
                        out,
                        "\"{}\",\"{}\",{},{},{},{},{},{},{}",
                        scenario.replace('"', "\"\""),
                        label.replace('"', "\"\""),
                        c.of_reach,
                        c.within_slo,
                        c.services_met.0,
                        c.services_met.1,
                        c.lag_p99_ms,
                        c.load_max.map_or(String::new(), |l| l.to_string()),
                        c.services_met_where_reachable
                            .map_or(String::new(), |n| n.to_string()),
                    );
                }
            }
        }
        out
    }
}

/// Read every directory's `summary.csv` (the directory's name names its scenario).
pub fn read_dirs(dirs: &[PathBuf]) -> Result<Vec<Cell>, TestbedError> {
    let mut cells = Vec::new();
    for dir in dirs {
        let path = dir.join("summary.csv");
        let text = std::fs::read_to_string(&path).map_err(|e| TestbedError::io(&path, e))?;
        let name = dir
            .file_name()
            .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into());
        cells.extend(read_summary(&name, &text)?);
    }
    Ok(cells)
}

/// Write `compare.md` and `compare.csv` into `out` (`plot::comparison` draws
/// `compare.png`); returns the Markdown table.
pub fn write(out: &Path, comparison: &Comparison, lead: &str) -> Result<String, TestbedError> {
    std::fs::create_dir_all(out).map_err(|e| TestbedError::io(out, e))?;
    let table = comparison.markdown(lead);
    let file = |name: &str, text: &str| {
        let path = out.join(name);
        std::fs::write(&path, text).map_err(|e| TestbedError::io(&path, e))
    };
    file("compare.md", &table)?;
    file("compare.csv", &comparison.csv())?;
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "variant,strategy,label,requests,succeeded,failed,timeouts,slo_met,slo_share,reachable,reachable_share,avg_ms,p50_ms,p95_ms,p99_ms,max_ms,throughput,duration_s,services_met,services,repeat,lag_p50_ms,lag_p99_ms,lag_max_ms,load_start,load_max,noisy,proxy_connect_failures,proxy_timeouts,proxy_resets,proxy_evictions,proxy_readmissions";

    fn row(variant: &str, label: &str, reach: f64, lag: f64) -> String {
        format!(
            "{variant},x,{label},100,100,0,0,90,90.0,95,{reach},10,9,20,30,40,100,60,2,4,1,0.5,{lag},20,0.5,1.5,false,0,0,0,0,0"
        )
    }

    #[test]
    fn summaries_are_compared_by_scenario_and_strategy_with_the_median_of_repeats() {
        let a = [
            HEADER.to_string(),
            row("", "qos-pool #1", 97.0, 3.0),
            row("", "qos-pool #2", 99.0, 4.0),
            row("", "qos-pool #3", 98.0, 5.0),
            row("", "\"proximity:alpha=0.8,x\"", 90.0, 2.0),
            row("", "local", 96.5, 2.5),
        ]
        .join("\n");
        let b = [
            HEADER.to_string(),
            row("alone", "alone qos-pool", 80.0, 9.0),
            row("alone", "alone local", 85.0, 1.0),
        ]
        .join("\n");
        let mut cells = read_summary("n20-seed1", &a).unwrap();
        cells.extend(read_summary("n50-seed1", &b).unwrap());
        let c = compare(cells);
        assert_eq!(c.scenarios, ["n20-seed1", "n50-seed1 [alone]"]);
        assert_eq!(c.labels, ["qos-pool", "proximity:alpha=0.8,x", "local"]);
        let median = &c.cells[&("n20-seed1".into(), "qos-pool".into())];
        assert_eq!((median.of_reach, median.lag_p99_ms), (98.0, 5.0));
        let two = [
            HEADER.to_string(),
            row("", "local #1", 88.0, 3.0),
            row("", "local #2", 97.0, 4.0),
        ];
        let two = compare(read_summary("n20-seed2", &two.join("\n")).unwrap());
        let median = &two.cells[&("n20-seed2".into(), "local".into())];
        assert_eq!((median.of_reach, median.lag_p99_ms), (92.5, 3.0));
        assert_eq!(c.margin("n20-seed1", "qos-pool"), Some(1.5));
        assert_eq!(c.margin("n50-seed1 [alone]", "qos-pool"), Some(-5.0));
        let table = c.markdown("qos-pool");
        assert!(
            table.contains("| n20-seed1 | **98.0%** | 90.0% | 96.5% | +1.5 | 5.0 ms | 1.50 |"),
            "{table}"
        );
        assert!(
            table.contains("| n50-seed1 [alone] | 80.0% | – | **85.0%** | -5.0 |"),
            "{table}"
        );
        assert_eq!(c.csv().lines().count(), 1 + 3 + 2);
    }

    #[test]
    fn the_services_met_where_reachable_show_next_to_the_share_when_the_results_have_them() {
        let text = [
            format!("{HEADER},proxy_probes,services_met_where_reachable"),
            format!("{},0,3", row("", "qos-pool", 99.5, 2.0)),
            format!("{},0,", row("", "local", 99.0, 2.0)),
        ]
        .join("\n");
        let c = compare(read_summary("n50-seed1", &text).unwrap());
        let table = c.markdown("qos-pool");
        assert!(
            table.contains("| n50-seed1 | **99.5%** · 3/4 | 99.0% | +0.5 |"),
            "{table}"
        );
        assert!(c.csv().contains(",1.5,3\n"), "{}", c.csv());
    }

    #[test]
    fn a_summary_without_a_column_says_which() {
        let e = read_summary("d", "variant,label\n,x\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("d/summary.csv: no column reachable_share"),
            "{e}"
        );
    }
}
