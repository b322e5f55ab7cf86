//! MovieLens-100k (RecBole's `.inter`, `.user`, `.item` files) as a CTR task:
//! a rating of 4 or more is a click (`label`); a second label, `love`, is a
//! rating of 5, for multi-task models. Ratings are joined with user and item
//! attributes and with the user's history (`hist`: the items the user rated
//! 4 or more strictly before, most recent first, at most `HISTORY`), and
//! split at random, with a seed, into train and eval CSVs.

use std::collections::HashMap;
use std::fs;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context};

use crate::util::Rng;

/// Header of the written CSVs; `genres` and `hist` are `|`-separated.
pub const COLUMNS: &str = "label,user_id,item_id,age,gender,occupation,zip,year,genres,love,hist";

/// The most items a row's history holds.
pub const HISTORY: usize = 20;

#[derive(Debug, Clone, PartialEq)]
pub struct MovieLensReport {
    pub train_rows: usize,
    pub eval_rows: usize,
    pub positive_rate: f64,
    /// The time (Unix seconds) eval.csv starts at, for a split by time.
    pub split_time: Option<i64>,
}

/// Reads a tab-separated RecBole file: typed header (`name:type`), then rows
/// keyed by their first column.
fn read_table(path: &Path, want: &[&str]) -> anyhow::Result<Vec<Vec<String>>> {
    let text = fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .with_context(|| format!("{}: empty file", path.display()))?
        .split('\t')
        .map(|h| h.split(':').next().unwrap_or(h))
        .collect();
    let idx: Vec<usize> = want
        .iter()
        .map(|w| {
            header
                .iter()
                .position(|h| h == w)
                .with_context(|| format!("{}: no column {w:?} in header {header:?}", path.display()))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut rows = Vec::new();
    for (n, line) in lines.enumerate() {
        if line.is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split('\t').collect();
        if cells.len() != header.len() {
            bail!(
                "{}:{}: {} cells, header has {}",
                path.display(),
                n + 2,
                cells.len(),
                header.len()
            );
        }
        rows.push(idx.iter().map(|i| cells[*i].trim().to_string()).collect());
    }
    Ok(rows)
}

fn csv_cell(s: &str) -> String {
    s.chars()
        .map(|c| if c == ',' || c == '"' || c == '\n' { ' ' } else { c })
        .collect()
}

/// Per rating (`user_id`, `item_id`, `rating`, `timestamp` rows): the items
/// its user rated 4 or more at earlier times, most recent first, at most
/// `HISTORY`, `|`-separated.
fn histories(inter: &[Vec<String>]) -> anyhow::Result<Vec<String>> {
    let mut by_user: HashMap<&str, Vec<(f64, usize)>> = HashMap::new();
    for (i, r) in inter.iter().enumerate() {
        let t: f64 = r[3].parse().with_context(|| format!("bad timestamp {:?}", r[3]))?;
        by_user.entry(r[0].as_str()).or_default().push((t, i));
    }
    let mut out = vec![String::new(); inter.len()];
    for ratings in by_user.values_mut() {
        ratings.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut liked: Vec<(f64, &str)> = Vec::new();
        for &(t, i) in ratings.iter() {
            let earlier = liked.iter().rev().filter(|(lt, _)| *lt < t).take(HISTORY);
            out[i] = earlier.map(|(_, item)| *item).collect::<Vec<_>>().join("|");
            if inter[i][2].parse::<f64>().is_ok_and(|r| r >= 4.0) {
                liked.push((t, &inter[i][1]));
            }
        }
    }
    Ok(out)
}

/// Joins `dir`/ml-100k.{inter,user,item} and writes `out`/train.csv and
/// `out`/eval.csv, with `eval_fraction` of the ratings in eval, drawn at
/// random.
pub fn prepare_movielens(dir: &Path, out: &Path, eval_fraction: f64, seed: u64) -> anyhow::Result<MovieLensReport> {
    let (rows, positives) = movielens_rows(dir)?;
    let mut rows: Vec<String> = rows.into_iter().map(|(_, r)| r).collect();
    Rng::new(seed).shuffle(&mut rows);
    let n_eval = ((rows.len() as f64) * eval_fraction).round() as usize;
    let (eval, train) = rows.split_at(n_eval);
    write_split(out, (train, eval), positives, None)
}

/// `prepare_movielens` in time order: train.csv holds the ratings before
/// a time T, eval.csv those from T on (the last `eval_fraction` of them),
/// each in the order they were given (ties by user and item), as a stream
/// replays them. The report gives T (Unix seconds).
pub fn prepare_movielens_by_time(dir: &Path, out: &Path, eval_fraction: f64) -> anyhow::Result<MovieLensReport> {
    let (mut rows, positives) = movielens_rows(dir)?;
    rows.sort_by_key(|r| r.0);
    let n_train = rows.len() - ((rows.len() as f64) * eval_fraction).round() as usize;
    let split_time = rows.get(n_train).map(|r| r.0 .0);
    let lines: Vec<String> = rows.into_iter().map(|(_, r)| r).collect();
    let (train, eval) = lines.split_at(n_train);
    write_split(out, (train, eval), positives, split_time)
}

/// Writes the two files of a split and reports them (`positives` among all
/// their rows).
fn write_split(
    out: &Path,
    (train, eval): (&[String], &[String]),
    positives: usize,
    split_time: Option<i64>,
) -> anyhow::Result<MovieLensReport> {
    fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    for (name, part) in [("train.csv", train), ("eval.csv", eval)] {
        let path = out.join(name);
        let mut w =
            BufWriter::new(fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?);
        writeln!(w, "{COLUMNS}")?;
        for line in part {
            writeln!(w, "{line}")?;
        }
        w.flush().with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(MovieLensReport {
        train_rows: train.len(),
        eval_rows: eval.len(),
        positive_rate: positives as f64 / (train.len() + eval.len()).max(1) as f64,
        split_time,
    })
}

/// A rating's (timestamp, user, item), for ordering, and its row of COLUMNS.
type Rating = ((i64, u64, u64), String);

/// Every rating as a row of COLUMNS with its (timestamp, user, item) for
/// ordering, and the count of positives.
fn movielens_rows(dir: &Path) -> anyhow::Result<(Vec<Rating>, usize)> {
    let users: HashMap<String, Vec<String>> = read_table(
        &dir.join("ml-100k.user"),
        &["user_id", "age", "gender", "occupation", "zip_code"],
    )?
    .into_iter()
    .map(|mut r| (r.remove(0), r))
    .collect();
    let items: HashMap<String, Vec<String>> =
        read_table(&dir.join("ml-100k.item"), &["item_id", "release_year", "class"])?
            .into_iter()
            .map(|mut r| (r.remove(0), r))
            .collect();
    let inter = read_table(
        &dir.join("ml-100k.inter"),
        &["user_id", "item_id", "rating", "timestamp"],
    )?;
    let history = histories(&inter)?;
    let mut rows = Vec::with_capacity(inter.len());
    let mut positives = 0usize;
    for (r, hist) in inter.iter().zip(&history) {
        let user = users
            .get(&r[0])
            .with_context(|| format!("rating names unknown user {}", r[0]))?;
        let item = items
            .get(&r[1])
            .with_context(|| format!("rating names unknown item {}", r[1]))?;
        let rating: f64 = r[2].parse().with_context(|| format!("bad rating {:?}", r[2]))?;
        let label = (rating >= 4.0) as u8;
        let love = (rating >= 5.0) as u8;
        positives += label as usize;
        // A few items have no year (spelled "unkonwn"): leave the cell empty
        // so the config's default_val applies.
        let year = if item[0].parse::<u32>().is_ok() {
            item[0].as_str()
        } else {
            ""
        };
        let genres = item[1].split_whitespace().collect::<Vec<_>>().join("|");
        let ts = r[3].parse::<f64>().unwrap_or(0.0) as i64;
        let order = (ts, r[0].parse::<u64>().unwrap_or(0), r[1].parse::<u64>().unwrap_or(0));
        rows.push((
            order,
            format!(
                "{label},{},{},{},{},{},{},{},{},{love},{hist}",
                r[0],
                r[1],
                csv_cell(&user[0]),
                csv_cell(&user[1]),
                csv_cell(&user[2]),
                csv_cell(&user[3]),
                year,
                csv_cell(&genres)
            ),
        ));
    }
    Ok((rows, positives))
}
