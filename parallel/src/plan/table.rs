//! The plan as text: the layer table, then memory per device, then the collectives.

use super::ShardingPlan;
use weft_nn::tp::Placement;

fn mib(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn placement(p: &Placement) -> String {
    match p {
        Placement::Replicate => "replicated".into(),
        Placement::Shard { axis, sizes } => {
            let s: Vec<String> = sizes.iter().map(|x| x.to_string()).collect();
            format!("axis {axis} [{}]", s.join(", "))
        }
    }
}

impl std::fmt::Display for ShardingPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Sharding plan for \"{}\": {} model x {} data ranks, input {:?}",
            self.model, self.model_axis, self.data_axis, self.input_shape
        )?;
        let mut rows: Vec<[String; 4]> = Vec::new();
        for l in &self.layers {
            let vars: Vec<String> = l
                .variables
                .iter()
                .map(|v| {
                    format!(
                        "{} {:?}: {}",
                        v.path.rsplit('/').next().unwrap_or(&v.path),
                        v.shape,
                        placement(&v.placement)
                    )
                })
                .collect();
            let first = vars.first().cloned().unwrap_or_default();
            rows.push([format!("{} ({})", l.path, l.kind), l.style.name().to_string(), first, l.reason.clone()]);
            for v in vars.iter().skip(1) {
                rows.push([String::new(), String::new(), v.clone(), String::new()]);
            }
        }
        let head = ["layer", "style", "variables", "reason"];
        let w: Vec<usize> =
            (0..3).map(|i| rows.iter().map(|r| r[i].len()).chain([head[i].len()]).max().unwrap_or(0) + 2).collect();
        let line = |f: &mut std::fmt::Formatter<'_>, r: [&str; 4]| {
            writeln!(f, "{:<w0$}{:<w1$}{:<w2$}{}", r[0], r[1], r[2], r[3], w0 = w[0], w1 = w[1], w2 = w[2])
        };
        line(f, head)?;
        for r in &rows {
            line(f, [&r[0], &r[1], &r[2], &r[3]])?;
        }
        if let Some(sizes) = &self.output {
            writeln!(f, "output: split over its last axis {sizes:?} (the loss runs on the shards)")?;
        }
        writeln!(
            f,
            "\nper device (optimizer with {} slots per weight; activations estimated for the batch):",
            self.optimizer_slots
        )?;
        writeln!(
            f,
            "{:<8}{:>14}{:>14}{:>14}{:>14}{:>14}",
            "rank", "params", "grads", "optimizer", "activations", "total"
        )?;
        for m in &self.memory {
            writeln!(
                f,
                "{:<8}{:>14}{:>14}{:>14}{:>14}{:>14}",
                m.rank,
                mib(m.params),
                mib(m.grads),
                mib(m.optimizer),
                mib(m.activations),
                mib(m.total())
            )?;
        }
        let loss = self.loss.as_ref().map_or(String::new(), |l| format!(", loss {l}"));
        writeln!(
            f,
            "\ncollectives per training step ({} in all, {}{loss}):",
            self.collectives.len(),
            mib(self.collective_bytes())
        )?;
        for c in &self.collectives {
            writeln!(f, "  {:<11}{:<7}{:<10}{:>11}  {:?} at {}", c.op, c.axis, c.pass, mib(c.bytes), c.shape, c.at)?;
        }
        if self.loss_is_conditional() {
            writeln!(
                f,
                "  (planned without a loss: the three loss collectives run only for sparse cross-entropy from logits;\n   \
                 any other loss all-gathers the output instead. AutoConfig::loss makes the list exact.)"
            )?;
        }
        Ok(())
    }
}
