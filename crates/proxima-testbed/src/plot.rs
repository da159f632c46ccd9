//! PNG plots in the style of the papers' figures, drawn with `plotters` on its bitmap
//! backend.
//!
//! * `instances[-<variant>].png`: requests per instance, one panel per service, one bar
//!   per strategy (QEdgeProxy Fig. 4, proxy-mity Fig. 10); failures are counted in the
//!   caption, not drawn as an instance;
//! * `phases[-<variant>].png`: the request rate (req/s) of each instance in each phase
//!   between events, a panel per service and strategy, one y-scale per service
//!   (QEdgeProxy Fig. 5);
//! * `timeline[-<variant>].png`: every request's response time over time on a log scale,
//!   one panel per strategy on shared axes, one colour per service with its own SLO line,
//!   failures as crosses, and the events labelled above the plot in rows that never
//!   overlap or leave the image (with several variants, only for those with events);
//! * `summary.png` (scenarios with variants): average response time and throughput per
//!   run, one line per strategy over the variants and one per variant over the
//!   strategies (proxy-mity Fig. 9, RAP Fig. 6, KubeEdge Fig. 7).
//!
//! * `compare.png` (`proxima-testbed compare`): each strategy's share of reach per
//!   scenario, and the points each is behind the best of its scenario;
//! * `coordinates.png` (`proxima-testbed coordinates`): the median and p90 relative
//!   error of network coordinates' RTT predictions after each probe round, one line per
//!   cluster size.
//!
//! Text is rendered with `ab_glyph` from a TrueType font found at run time
//! (`PROXIMA_TESTBED_FONT`, else DejaVu Sans or Liberation Sans in their usual places);
//! without one, plots are skipped with a message rather than drawn without labels.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::stats::{RunReport, ERROR_BUCKET};
use crate::TestbedError;

const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// Register a font for `sans-serif` once; `Err` says why plots cannot have text.
fn font() -> Result<(), String> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let from_env = std::env::var_os("PROXIMA_TESTBED_FONT").map(PathBuf::from);
        let candidates = from_env
            .into_iter()
            .chain(FONT_CANDIDATES.iter().map(PathBuf::from));
        for path in candidates {
            if let Ok(bytes) = std::fs::read(&path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                for style in [FontStyle::Normal, FontStyle::Bold] {
                    if plotters::style::register_font("sans-serif", style, bytes).is_err() {
                        return Err(format!("{} is not a usable TrueType font", path.display()));
                    }
                }
                return Ok(());
            }
        }
        Err("no TrueType font found (set PROXIMA_TESTBED_FONT to a .ttf file)".to_string())
    })
    .clone()
}

fn err(e: impl std::fmt::Display) -> TestbedError {
    TestbedError::Plot(e.to_string())
}

/// The legend of every chart: top right, on a translucent white box so that the
/// series under it stay visible.
fn draw_legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    font_size: u32,
) -> Result<(), TestbedError>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", font_size))
        .draw()
        .map_err(err)
}

/// Distinct colours for strategies, in order.
fn colour(i: usize) -> RGBColor {
    const PALETTE: &[RGBColor] = &[
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    PALETTE[i % PALETTE.len()]
}

fn file_name(base: &str, variant: &str) -> String {
    if variant.is_empty() {
        format!("{base}.png")
    } else {
        let safe: String = variant
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("{base}-{safe}.png")
    }
}

/// Draw every plot for `runs` into `dir`; returns the files written. `Ok(empty)` with a
/// message on stderr when no font is available.
pub fn draw_all(dir: &Path, runs: &[RunReport]) -> Result<Vec<PathBuf>, TestbedError> {
    if let Err(why) = font() {
        eprintln!("plots skipped: {why}");
        return Ok(Vec::new());
    }
    std::fs::create_dir_all(dir).map_err(|e| TestbedError::io(dir, e))?;
    let mut variants: Vec<&str> = Vec::new();
    for r in runs {
        if !variants.contains(&r.variant.as_str()) {
            variants.push(&r.variant);
        }
    }
    let mut written = Vec::new();
    for variant in &variants {
        let group: Vec<&RunReport> = runs.iter().filter(|r| r.variant == *variant).collect();
        let path = dir.join(file_name("instances", variant));
        instances(&path, &group, variant)?;
        written.push(path);
        if group.iter().any(|r| r.phases.len() > 1) {
            let path = dir.join(file_name("phases", variant));
            phases(&path, &group, variant)?;
            written.push(path);
        }
        // Over many variants without events the timelines say little and weigh a lot.
        if variants.len() == 1 || group.iter().any(|r| r.phases.len() > 1) {
            let path = dir.join(file_name("timeline", variant));
            timeline(&path, &group, variant)?;
            written.push(path);
        }
    }
    if variants.len() > 1 {
        let path = dir.join("summary.png");
        summary(&path, runs)?;
        written.push(path);
    }
    Ok(written)
}

fn title(what: &str, runs: &[&RunReport], variant: &str) -> String {
    let scenario = runs.first().map_or("", |r| r.scenario.as_str());
    match variant {
        "" => format!("{scenario}: {what}"),
        v => format!("{scenario} [{v}]: {what}"),
    }
}

/// The services of `runs` (from the first), with their objective for captions.
fn service_names(runs: &[&RunReport]) -> Vec<String> {
    runs.first()
        .map(|r| r.services.iter().map(|s| s.all.service.clone()).collect())
        .unwrap_or_default()
}

fn objective(run: &RunReport, service: usize) -> String {
    run.services.get(service).map_or(String::new(), |s| {
        format!("SLO {} ms @ p{}", s.all.slo_ms, s.all.percentile)
    })
}

/// Grouped bars: one group per `groups` entry, one bar per series.
fn bars(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    caption: &str,
    y_desc: &str,
    groups: &[String],
    series: &[(String, Vec<f64>)],
    top: f64,
) -> Result<(), TestbedError> {
    let n = groups.len().max(1);
    let labels = groups.to_vec();
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 17))
        .margin(10)
        .x_label_area_size(if n > 12 { 60 } else { 35 })
        .y_label_area_size(60)
        // Headroom for the legend box in the upper right, which grows with its entries.
        .build_cartesian_2d(
            0f64..n as f64,
            0f64..top.max(1e-9) * (1.15 + 0.08 * series.len() as f64),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            let centre = x - x.floor();
            if (centre - 0.5).abs() < 1e-6 {
                labels.get(x.floor() as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .y_label_formatter(&|y| {
            if top >= 100.0 {
                format!("{y:.0}")
            } else {
                format!("{y:.1}")
            }
        })
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    let k = series.len().max(1) as f64;
    let width = 0.8 / k;
    for (s, (label, values)) in series.iter().enumerate() {
        let c = colour(s);
        let left = 0.1 + width * s as f64;
        chart
            .draw_series(values.iter().enumerate().map(|(i, v)| {
                let x0 = i as f64 + left;
                Rectangle::new([(x0, 0.0), (x0 + width * 0.95, *v)], c.filled())
            }))
            .map_err(err)?
            .label(label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    draw_legend(&mut chart, 13)
}

/// One panel per service: its instances' requests, one bar per strategy. Requests
/// without an instance (failures) are not a bar; their count is in the caption.
fn instances(path: &Path, runs: &[&RunReport], variant: &str) -> Result<(), TestbedError> {
    let services = service_names(runs);
    let widest = runs.first().map_or(1, |r| {
        r.services
            .iter()
            .map(|s| s.all.per_instance.len())
            .max()
            .unwrap_or(1)
    });
    // Wide enough for the longest caption (the failures per strategy) as well.
    let caption_px = runs.iter().map(|r| r.label.len() + 8).sum::<usize>() + 80;
    let width = (300 + widest as u32 * (30 + 16 * runs.len() as u32))
        .max(caption_px as u32 * 9)
        .clamp(900, 3000);
    let panel = 420;
    let root = BitMapBackend::new(path, (width, 40 + panel * services.len().max(1) as u32))
        .into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (header, body) = root.split_vertically(40);
    header
        .draw(&Text::new(
            title("requests per instance, per service", runs, variant),
            (10, 10),
            ("sans-serif", 20),
        ))
        .map_err(err)?;
    let panels = body.split_evenly((services.len().max(1), 1));
    for (k, (service, area)) in services.iter().zip(&panels).enumerate() {
        // Instances that never answered in any run (e.g. never started) are no bars.
        let names = answering_instances(runs, k, runs[0]);
        let series: Vec<(String, Vec<f64>)> = runs
            .iter()
            .map(|r| {
                let per = &r.services[k].all.per_instance;
                (
                    r.label.clone(),
                    names.iter().map(|n| count(per, n) as f64).collect(),
                )
            })
            .collect();
        let failed: Vec<String> = runs
            .iter()
            .filter(|r| r.services[k].all.summary.failed > 0)
            .map(|r| format!("{} {}", r.label, r.services[k].all.summary.failed))
            .collect();
        let caption = if failed.is_empty() {
            format!("{service} ({})", objective(runs[0], k))
        } else {
            format!(
                "{service} ({}); failed, no instance: {}",
                objective(runs[0], k),
                failed.join(", ")
            )
        };
        let top = series
            .iter()
            .flat_map(|(_, v)| v.iter().copied())
            .fold(1.0, f64::max);
        bars(area, &caption, "requests", &names, &series, top)?;
    }
    root.present().map_err(err)
}

/// The instances of service `k`, in `run`'s order, that answered in at least one of `runs`
/// (the error bucket is no instance).
fn answering_instances(runs: &[&RunReport], k: usize, run: &RunReport) -> Vec<String> {
    run.services[k]
        .all
        .per_instance
        .iter()
        .filter(|(n, _)| n != ERROR_BUCKET)
        .filter(|(n, _)| {
            runs.iter()
                .any(|r| count(&r.services[k].all.per_instance, n) > 0)
        })
        .map(|(n, _)| n.clone())
        .collect()
}

fn count(per_instance: &[(String, u64)], name: &str) -> u64 {
    per_instance
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, c)| *c)
}

/// When the traffic of `run` ended (s): the last response read.
fn traffic_end(run: &RunReport) -> f64 {
    run.records
        .iter()
        .map(|r| (r.start + r.latency).as_secs_f64())
        .fold(0.0, f64::max)
        .max(0.1)
}

/// Phases of `run` with their length (s): from their start to the next one's, the
/// last to the end of the traffic.
fn phase_lengths(run: &RunReport) -> Vec<(String, f64)> {
    let end = traffic_end(run);
    let starts: Vec<f64> = run
        .phase_starts
        .iter()
        .map(|(_, t)| t.as_secs_f64())
        .collect();
    run.phase_starts
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            let next = starts.get(i + 1).copied().unwrap_or(end);
            (name.clone(), (next - starts[i]).max(1e-3))
        })
        .collect()
}

/// A grid of panels, services down and strategies across: each phase's request rate
/// (req/s, so that phases of different lengths compare) per instance of the service.
fn phases(path: &Path, runs: &[&RunReport], variant: &str) -> Result<(), TestbedError> {
    let services = service_names(runs);
    let (rows, cols) = (services.len().max(1), runs.len().max(1));
    let phase_count = runs.iter().map(|r| r.phases.len()).max().unwrap_or(1);
    let panel_w = (180 + phase_count as u32 * 70).clamp(560, 1400);
    let root = BitMapBackend::new(path, (panel_w * cols as u32, 40 + 360 * rows as u32))
        .into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (header, body) = root.split_vertically(40);
    header
        .draw(&Text::new(
            title(
                "request rate per instance in each phase (req/s; phases differ in length)",
                runs,
                variant,
            ),
            (10, 10),
            ("sans-serif", 20),
        ))
        .map_err(err)?;
    let panels = body.split_evenly((rows, cols));
    // One y-scale per service, shared by the strategies.
    for (k, service) in services.iter().enumerate() {
        let rate_of = |run: &RunReport| -> (Vec<String>, Vec<(String, Vec<f64>)>) {
            let lengths = phase_lengths(run);
            let svc = &run.services[k];
            // No series for an instance that never answered in any run.
            let names = answering_instances(runs, k, run);
            let groups: Vec<String> = lengths.iter().map(|(n, _)| n.clone()).collect();
            let series = names
                .iter()
                .map(|inst| {
                    let values = svc
                        .phases
                        .iter()
                        .zip(&lengths)
                        .map(|((_, p), (_, len))| count(&p.per_instance, inst) as f64 / len)
                        .collect();
                    (inst.clone(), values)
                })
                .collect();
            (groups, series)
        };
        let top = runs
            .iter()
            .flat_map(|r| rate_of(r).1.into_iter().flat_map(|(_, v)| v))
            .fold(1e-3, f64::max);
        for (c, run) in runs.iter().enumerate() {
            let (groups, series) = rate_of(run);
            let caption = format!("{service}, {}", run.label);
            bars(
                &panels[k * cols + c],
                &caption,
                "req/s",
                &groups,
                &series,
                top,
            )?;
        }
    }
    root.present().map_err(err)
}

/// Rows of event labels that do not overlap: `(x pixel, text)` sorted by x give each
/// label a row (0 = top) and a left edge kept inside `[left, right]`.
fn label_rows(labels: &[(i32, String)], left: i32, right: i32, char_px: i32) -> Vec<(usize, i32)> {
    let mut row_ends: Vec<i32> = Vec::new();
    labels
        .iter()
        .map(|(x, text)| {
            let width = text.chars().count() as i32 * char_px + 6;
            // Centred on its line, but never past the panel's edges.
            let start = (x - width / 2).clamp(left, (right - width).max(left));
            let row = match row_ends.iter().position(|end| *end < start) {
                Some(r) => r,
                None => {
                    row_ends.push(i32::MIN);
                    row_ends.len() - 1
                }
            };
            row_ends[row] = start + width;
            (row, start)
        })
        .collect()
}

/// One panel per strategy, on the same axes: every request's response time (log
/// scale) over time, one colour per service with its SLO as a dashed line of that
/// colour, failures as black crosses, and the events marked with labels above the
/// plot that never overlap.
fn timeline(path: &Path, runs: &[&RunReport], variant: &str) -> Result<(), TestbedError> {
    const WIDTH: u32 = 1200;
    const LEFT: i32 = 70;
    const CHAR_PX: i32 = 7;
    let services = service_names(runs);
    let end = runs.iter().map(|r| traffic_end(r)).fold(0.1, f64::max);
    let all_ms = runs
        .iter()
        .flat_map(|r| r.records.iter().map(|x| x.latency.as_secs_f64() * 1e3));
    let (lo, hi) = all_ms.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let slo_max = runs
        .iter()
        .flat_map(|r| r.services.iter().map(|s| s.all.slo_ms))
        .fold(0.0, f64::max);
    let bottom = (lo.min(slo_max).max(0.05) * 0.8).max(0.05);
    let top = hi.max(slo_max) * 1.3;
    // Label rows are the same for every panel (same events, same axis) when the runs
    // share their events; reserve the most any panel needs.
    let plot_w = WIDTH as i32 - LEFT - 20;
    let to_px = |t: f64| LEFT + 10 + (t / end * plot_w as f64) as i32;
    let layouts: Vec<Vec<(usize, i32)>> = runs
        .iter()
        .map(|r| {
            let labels: Vec<(i32, String)> = r
                .phase_starts
                .iter()
                .skip(1)
                .map(|(n, t)| (to_px(t.as_secs_f64()), n.clone()))
                .collect();
            label_rows(&labels, LEFT, WIDTH as i32 - 10, CHAR_PX)
        })
        .collect();
    let rows = layouts
        .iter()
        .flat_map(|l| l.iter().map(|(r, _)| r + 1))
        .max()
        .unwrap_or(0) as u32;
    let band = rows * 16 + 4;
    let panel_h = 300 + band;
    let legend_h = 30;
    let root = BitMapBackend::new(path, (WIDTH, 40 + legend_h + panel_h * runs.len() as u32))
        .into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    root.draw(&Text::new(
        title("response time over time (log scale)", runs, variant),
        (10, 10),
        ("sans-serif", 20),
    ))
    .map_err(err)?;
    // The legend: one entry per service, then failures.
    let mut x = 10;
    for (k, service) in services.iter().enumerate() {
        let text = format!("{service} ({})", objective(runs[0], k));
        root.draw(&Rectangle::new([(x, 46), (x + 12, 58)], colour(k).filled()))
            .map_err(err)?;
        root.draw(&Text::new(text.clone(), (x + 16, 45), ("sans-serif", 13)))
            .map_err(err)?;
        x += 16 + text.chars().count() as i32 * CHAR_PX + 20;
    }
    if runs.iter().any(|r| r.summary.failed > 0) {
        root.draw(&Cross::new((x + 6, 52), 5, BLACK.stroke_width(2)))
            .map_err(err)?;
        root.draw(&Text::new(
            "failed (timeouts at the client's timeout)",
            (x + 16, 45),
            ("sans-serif", 13),
        ))
        .map_err(err)?;
    }

    for (i, run) in runs.iter().enumerate() {
        let y0 = 40 + legend_h as i32 + (panel_h * i as u32) as i32;
        let area = root.clone().shrink((0, y0 as u32), (WIDTH, panel_h));
        area.draw(&Text::new(run.label.clone(), (10, 2), ("sans-serif", 16)))
            .map_err(err)?;
        let mut chart = ChartBuilder::on(&area)
            .margin_top(band as i32 + 20)
            .margin_right(10)
            .margin_bottom(6)
            .x_label_area_size(30)
            .y_label_area_size(LEFT as u32)
            .build_cartesian_2d(0f64..end, (bottom..top).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc("response time (ms)")
            .y_label_formatter(&|v| {
                if *v >= 10.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.1}")
                }
            })
            .label_style(("sans-serif", 12))
            .draw()
            .map_err(err)?;
        for (k, _) in services.iter().enumerate() {
            let c = colour(k);
            chart
                .draw_series(
                    run.records
                        .iter()
                        .filter(|r| {
                            r.succeeded()
                                && run.client_service.get(usize::from(r.client)) == Some(&k)
                        })
                        .map(|r| {
                            Circle::new(
                                (
                                    r.start.as_secs_f64(),
                                    (r.latency.as_secs_f64() * 1e3).max(bottom),
                                ),
                                2,
                                c.mix(0.45).filled(),
                            )
                        }),
                )
                .map_err(err)?;
        }
        chart
            .draw_series(run.records.iter().filter(|r| !r.succeeded()).map(|r| {
                Cross::new(
                    (
                        r.start.as_secs_f64(),
                        (r.latency.as_secs_f64() * 1e3).max(bottom),
                    ),
                    3,
                    BLACK.stroke_width(1),
                )
            }))
            .map_err(err)?;
        for (k, svc) in run.services.iter().enumerate() {
            let slo = svc.all.slo_ms;
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, slo), (end, slo)],
                    8,
                    5,
                    colour(k).stroke_width(2),
                ))
                .map_err(err)?;
        }
        let band_top = y0 + 22;
        for ((name, at), (row, left)) in run.phase_starts.iter().skip(1).zip(&layouts[i]) {
            let t = at.as_secs_f64();
            chart
                .draw_series(LineSeries::new(
                    [(t, bottom), (t, top)],
                    BLACK.mix(0.6).stroke_width(1),
                ))
                .map_err(err)?;
            let (px, plot_top) = chart.backend_coord(&(t, top));
            let label_y = band_top + *row as i32 * 16;
            root.draw(&Text::new(
                name.clone(),
                (*left, label_y),
                ("sans-serif", 12),
            ))
            .map_err(err)?;
            // A thin leader from the label down to its line.
            root.draw(&PathElement::new(
                [(px, label_y + 13), (px, plot_top)],
                BLACK.mix(0.3).stroke_width(1),
            ))
            .map_err(err)?;
        }
    }
    root.present().map_err(err)
}

/// One line chart: `x` categories, one line per series.
fn lines(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    caption: &str,
    y_desc: &str,
    x: &[String],
    series: &[(String, Vec<Option<f64>>)],
) -> Result<(), TestbedError> {
    let top = series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .fold(0.0, f64::max)
        .max(1e-3);
    let n = x.len().max(1);
    let labels = x.to_vec();
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(if n > 8 { 70 } else { 35 })
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..top * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|v| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .label_style(("sans-serif", 12))
        .draw()
        .map_err(err)?;
    for (s, (label, values)) in series.iter().enumerate() {
        let c = colour(s);
        let points: Vec<(f64, f64)> = values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((i as f64, (*v)?)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))
            .map_err(err)?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], c.stroke_width(2)));
        chart
            .draw_series(points.into_iter().map(|p| Circle::new(p, 3, c.filled())))
            .map_err(err)?;
    }
    draw_legend(&mut chart, 12)
}

fn summary(path: &Path, runs: &[RunReport]) -> Result<(), TestbedError> {
    let mut variants: Vec<String> = Vec::new();
    let mut strategies: Vec<String> = Vec::new();
    for r in runs {
        if !variants.contains(&r.variant) {
            variants.push(r.variant.clone());
        }
        let s = strategy_label(r);
        if !strategies.contains(&s) {
            strategies.push(s);
        }
    }
    let value = |variant: &str, strategy: &str, f: &dyn Fn(&RunReport) -> f64| {
        runs.iter()
            .find(|r| r.variant == variant && strategy_label(r) == strategy)
            .map(f)
    };
    let avg = |r: &RunReport| r.summary.avg_ms;
    let thr = |r: &RunReport| r.summary.throughput;
    let root = BitMapBackend::new(path, (1300, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((2, 2));
    let scenario = runs.first().map_or("", |r| r.scenario.as_str());
    let by_variant = |f: &dyn Fn(&RunReport) -> f64| -> Vec<(String, Vec<Option<f64>>)> {
        strategies
            .iter()
            .map(|s| (s.clone(), variants.iter().map(|v| value(v, s, f)).collect()))
            .collect()
    };
    let by_strategy = |f: &dyn Fn(&RunReport) -> f64| -> Vec<(String, Vec<Option<f64>>)> {
        variants
            .iter()
            .map(|v| {
                (
                    v.clone(),
                    strategies.iter().map(|s| value(v, s, f)).collect(),
                )
            })
            .collect()
    };
    lines(
        &panels[0],
        &format!("{scenario}: average response time by variant"),
        "avg response time (ms)",
        &variants,
        &by_variant(&avg),
    )?;
    lines(
        &panels[1],
        &format!("{scenario}: throughput by variant"),
        "requests/s",
        &variants,
        &by_variant(&thr),
    )?;
    lines(
        &panels[2],
        "average response time by strategy",
        "avg response time (ms)",
        &strategies,
        &by_strategy(&avg),
    )?;
    lines(
        &panels[3],
        "throughput by strategy",
        "requests/s",
        &strategies,
        &by_strategy(&thr),
    )?;
    root.present().map_err(err)
}

/// The strategy part of a run's label (labels are `<variant> <strategy>`).
fn strategy_label(r: &RunReport) -> String {
    match r.variant.as_str() {
        "" => r.label.clone(),
        v => r
            .label
            .strip_prefix(v)
            .map_or(r.label.clone(), |s| s.trim().to_string()),
    }
}

/// The median and p90 prediction error of each run after every few rounds, one line
/// per run (see [`crate::coordinates`]). `Ok(false)` with a message when no font is
/// available.
pub fn coordinate_errors(
    path: &Path,
    runs: &[crate::coordinates::SimReport],
) -> Result<bool, TestbedError> {
    if let Err(why) = font() {
        eprintln!("plot skipped: {why}");
        return Ok(false);
    }
    let rounds = runs.iter().map(|r| r.rounds.len()).max().unwrap_or(0);
    // About fifteen points per line keeps the round labels legible.
    let step = (rounds / 15).max(1);
    let shown: Vec<usize> = (1..=rounds).filter(|r| *r == 1 || r % step == 0).collect();
    let x: Vec<String> = shown.iter().map(|r| r.to_string()).collect();
    let series = |pick: &dyn Fn(&crate::coordinates::RoundError) -> Option<f64>| {
        runs.iter()
            .map(|run| {
                let label = format!("{} nodes (seed {})", run.options.nodes, run.options.seed);
                let values = shown
                    .iter()
                    .map(|r| run.rounds.get(r - 1).and_then(pick).map(|v| v * 100.0))
                    .collect();
                (label, values)
            })
            .collect::<Vec<_>>()
    };
    let root = BitMapBackend::new(path, (1300, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((1, 2));
    lines(
        &panels[0],
        "median relative error of predicted RTT, by round",
        "median error (%)",
        &x,
        &series(&|e| e.all.median),
    )?;
    lines(
        &panels[1],
        "90th percentile relative error, by round",
        "p90 error (%)",
        &x,
        &series(&|e| e.all.p90),
    )?;
    root.present().map_err(err)?;
    Ok(true)
}

/// `compare.png` (`proxima-testbed compare`): per scenario, each strategy's share of
/// reach (above) and how many points it is behind the best strategy of that scenario
/// (below, where differences of a point or two are visible). `Ok(false)` without a font.
pub fn comparison(
    path: &Path,
    comparison: &crate::compare::Comparison,
) -> Result<bool, TestbedError> {
    if let Err(why) = font() {
        eprintln!("plot skipped: {why}");
        return Ok(false);
    }
    let of_reach = |scenario: &String, label: &String| {
        comparison
            .cells
            .get(&(scenario.clone(), label.clone()))
            .map(|c| c.of_reach)
    };
    let best: Vec<f64> = comparison
        .scenarios
        .iter()
        .map(|s| {
            comparison
                .labels
                .iter()
                .filter_map(|l| of_reach(s, l))
                .fold(0.0, f64::max)
        })
        .collect();
    let series = |f: &dyn Fn(usize, f64) -> f64| -> Vec<(String, Vec<f64>)> {
        comparison
            .labels
            .iter()
            .map(|l| {
                let values = comparison
                    .scenarios
                    .iter()
                    .enumerate()
                    .map(|(i, s)| of_reach(s, l).map_or(0.0, |v| f(i, v)))
                    .collect();
                (l.clone(), values)
            })
            .collect()
    };
    let worst = series(&|i, v| best[i] - v)
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0, f64::max);
    // The far-behind baselines would flatten the close ones: the scale stops at 20.
    let cap = worst.clamp(1.0, 20.0);
    let behind = series(&|i, v| (best[i] - v).min(cap));
    let width = (300 + 90 * comparison.scenarios.len() * comparison.labels.len().max(1)) as u32;
    let root = BitMapBackend::new(path, (width.clamp(900, 2400), 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((2, 1));
    bars(
        &panels[0],
        "share of the requests some pod could serve within the SLO that were (of reach)",
        "of reach (%)",
        &comparison.scenarios,
        &series(&|_, v| v),
        100.0,
    )?;
    bars(
        &panels[1],
        "points of reach behind the best strategy of the scenario (0: the best; at most 20 drawn)",
        "points behind",
        &comparison.scenarios,
        &behind,
        cap,
    )?;
    root.present().map_err(err)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_labels_never_overlap_or_leave_the_panel() {
        let labels: Vec<(i32, String)> = [
            (100, "overload"),
            (110, "join"),
            (115, "region-flap"),
            (990, "the-last-one"),
        ]
        .into_iter()
        .map(|(x, t)| (x, t.to_string()))
        .collect();
        let placed = label_rows(&labels, 70, 1000, 7);
        let spans: Vec<(usize, i32, i32)> = placed
            .iter()
            .zip(&labels)
            .map(|((row, left), (_, t))| (*row, *left, *left + t.len() as i32 * 7 + 6))
            .collect();
        for (i, a) in spans.iter().enumerate() {
            assert!(a.1 >= 70 && a.2 <= 1000, "{a:?} leaves the panel");
            for b in &spans[i + 1..] {
                assert!(a.0 != b.0 || a.2 < b.1 || b.2 < a.1, "{a:?} overlaps {b:?}");
            }
        }
        // Close labels go to rows of their own; a far one shares the first row.
        assert_eq!(
            placed.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
            [0, 1, 2, 0]
        );
    }
}
