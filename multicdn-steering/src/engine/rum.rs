//! Rules 3–5, RUM: significance (the policy's gaps and the evidence's own standard errors,
//! shrunk by the correlation of paired probe loads), hysteresis and damping; and the tie-break
//! towards the warmer cache.

use multicdn_core::{ProviderId, Weights};

use super::{CohortInput, Comparison, Ctx, LastMove, MOVE_STEP_BP, SIGNIFICANCE_Z, same, share_of};

/// The numbers behind a RUM move.
#[derive(Clone, Copy)]
pub(super) struct RumFacts {
    pub(super) gap: f64,
    pub(super) relative: f64,
    pub(super) need_ms: f64,
    pub(super) need_rel: f64,
    pub(super) switching_back: bool,
    /// The pairs and the estimates' correlation, when the comparison was paired.
    pub(super) paired: Option<(u64, f64)>,
    /// Decided on the users' experience, the providers being equal on the unbiased signal.
    pub(super) warmer: bool,
}

impl RumFacts {
    /// What the journal says of how the gap was judged.
    pub(super) fn note(&self) -> String {
        if self.warmer {
            return "no material gap on the signal free of cache warmth; users get this \
                    provider faster now (its cache is the warmer): ties go to it"
                .to_owned();
        }
        self.paired.map_or_else(String::new, |(pairs, rho)| {
            format!(
                "paired on {pairs} probe loads: the two p75s correlate {rho:.2}, so the error of \
                 their difference is {:.0}% of what independent samples would leave",
                100.0 * (1.0 - rho.max(-1.0)).sqrt()
            )
        })
    }
}

/// A cohort's scored providers: `(provider, score, stderr)`, only those with at least
/// `min_samples` (or `min_pairs`, and as many pairs with another provider), up, and in the
/// policy; slowest first.
pub(super) fn scored<'i>(
    ctx: &Ctx<'_>,
    cmp: Comparison<'i>,
    slots: &mut [(Option<&'i ProviderId>, f64, f64); 8],
) -> usize {
    let rum = ctx.rum;
    let mut n = 0;
    for e in cmp.evidence {
        if n == slots.len() {
            break;
        }
        let enough = e.samples >= rum.min_samples
            || (e.samples >= rum.min_pairs
                && cmp.pairings.iter().any(|pe| {
                    pe.pairs >= rum.min_pairs
                        && (same(&pe.a, &e.provider) || same(&pe.b, &e.provider))
                }));
        if enough
            && !ctx.is_down(&e.provider)
            && !ctx.is_standby(&e.provider)
            && let Some(s) = e.score.filter(|s| s.is_finite() && *s >= 0.0)
            && ctx.providers.iter().any(|p| same(p, &e.provider))
        {
            slots[n] = (Some(&e.provider), s, e.stderr.unwrap_or(0.0));
            n += 1;
        }
    }
    // Slowest first (ties by id): an insertion sort, as a cohort scores two or three providers.
    let scored = &mut slots[..n];
    for i in 1..n {
        let mut j = i;
        while j > 0
            && scored[j]
                .1
                .total_cmp(&scored[j - 1].1)
                .then(scored[j - 1].0.cmp(&scored[j].0))
                .is_gt()
        {
            scored.swap(j - 1, j);
            j -= 1;
        }
    }
    n
}

/// The correlation of two providers' estimates in a cohort: from their pairing when it has
/// `min_pairs` pairs, else 0 (independent samples).
pub(super) fn estimate_correlation(
    ctx: &Ctx<'_>,
    cmp: Comparison<'_>,
    x: &ProviderId,
    y: &ProviderId,
) -> f64 {
    pairing(ctx, cmp, x, y).map_or(0.0, |(_, rho)| rho)
}

/// The pairs and the estimates' correlation of `x` and `y` in a cohort, when they have
/// `min_pairs` pairs.
pub(super) fn pairing(
    ctx: &Ctx<'_>,
    cmp: Comparison<'_>,
    x: &ProviderId,
    y: &ProviderId,
) -> Option<(u64, f64)> {
    cmp.pairings
        .iter()
        .find(|pe| pe.pairs >= ctx.rum.min_pairs && pe.compares(x, y))
        .map(|pe| (pe.pairs, pe.estimate_correlation()))
}

/// The gap `slow` must have over `best` to be significant: the policy's fixed gaps (times
/// `factor` for hysteresis) and [`SIGNIFICANCE_Z`] standard errors of the difference, which
/// shrinks by the estimates' correlation `rho` (0 for independent samples, more when both
/// were measured on the same loads). Returns `(gap, relative, need_ms, need_rel, significant)`.
pub(super) fn significance(
    ctx: &Ctx<'_>,
    slow: (f64, f64),
    best: (f64, f64),
    rho: f64,
    factor: f64,
) -> (f64, f64, f64, f64, bool) {
    let rum = ctx.rum;
    let gap = slow.0 - best.0;
    let relative = if slow.0 > 0.0 { gap / slow.0 } else { 0.0 };
    let variance = slow.1 * slow.1 + best.1 * best.1 - 2.0 * rho * slow.1 * best.1;
    let noise = SIGNIFICANCE_Z * variance.max(0.0).sqrt();
    let need_ms = (rum.absolute_gap.get().as_secs_f64() * 1000.0 * factor).max(noise);
    let need_rel = rum.relative_gap.fraction() * factor;
    (
        gap,
        relative,
        need_ms,
        need_rel,
        gap > need_ms && relative > need_rel,
    )
}

/// True when the cohort's own evidence shows `p` slower than its fastest provider beyond the
/// significance gap (recovery never walks traffic towards such a provider).
pub(super) fn shown_slower(ctx: &Ctx<'_>, input: Option<&CohortInput>, p: &ProviderId) -> bool {
    let Some(input) = input else { return false };
    let cmp = input.primary();
    let mut slots: [(Option<&ProviderId>, f64, f64); 8] = [(None, 0.0, 0.0); 8];
    let n = scored(ctx, cmp, &mut slots);
    if n < 2 {
        return false;
    }
    let (Some(best), best_score, best_se) = slots[n - 1] else {
        return false;
    };
    if same(best, p) {
        return false;
    }
    slots[..n - 1].iter().any(|&(q, score, se)| {
        q.is_some_and(|q| same(q, p))
            && significance(
                ctx,
                (score, se),
                (best_score, best_se),
                estimate_correlation(ctx, cmp, p, best),
                1.0,
            )
            .4
    })
}

/// Rules 3–5: significance, hysteresis and damping.
pub(super) fn rum<'i>(
    ctx: &Ctx<'_>,
    w: &Weights,
    cmp: Comparison<'i>,
    last: Option<&LastMove>,
) -> Option<(&'i ProviderId, &'i ProviderId, u32, RumFacts)> {
    let rum = ctx.rum;
    let mut slots: [(Option<&'i ProviderId>, f64, f64); 8] = [(None, 0.0, 0.0); 8];
    let n = scored(ctx, cmp, &mut slots);
    if n < 2 {
        return None;
    }
    let scored = &slots[..n];
    let (best, best_score, best_se) = *scored.last()?;
    let best = best?;
    for &(slow, slow_score, slow_se) in &scored[..scored.len() - 1] {
        let slow = slow?;
        let room = share_of(w, slow).saturating_sub(ctx.floor(slow));
        if room == 0 || room < MOVE_STEP_BP.min(rum.step.bp()) {
            // Less than a step above its floor: nothing worth a move.
            continue;
        }
        let switching_back = last.is_some_and(|m| &m.from == best && &m.to == slow);
        let factor = if switching_back {
            rum.switch_back_factor.max(1.0)
        } else {
            1.0
        };
        let paired = pairing(ctx, cmp, slow, best);
        let rho = paired.map_or(0.0, |(_, rho)| rho);
        let (gap, relative, need_ms, need_rel, significant) = significance(
            ctx,
            (slow_score, slow_se),
            (best_score, best_se),
            rho,
            factor,
        );
        if !significant {
            // Every other provider is closer to the best: none is significant either.
            return None;
        }
        let amount = rum.step.bp().min(room);
        return Some((
            slow,
            best,
            amount,
            RumFacts {
                gap,
                relative,
                need_ms,
                need_rel,
                switching_back,
                paired,
                warmer: false,
            },
        ));
    }
    None
}

/// Ties go to the warmer cache: where the cohort's unbiased evidence shows its providers within
/// the policy's gaps of each other, a significant gap in what its users get now (misses
/// included) moves traffic, by the same rules, towards the provider they get faster, when that
/// provider already carries most of the cohort.
pub(super) fn warmer<'i>(
    ctx: &Ctx<'_>,
    w: &Weights,
    input: &'i CohortInput,
    last: Option<&LastMove>,
) -> Option<(&'i ProviderId, &'i ProviderId, u32, RumFacts)> {
    if input.experienced.is_empty() {
        return None;
    }
    let (slow, best, bp, facts) = rum(ctx, w, input.experience(), last)?;
    // A tie never undoes a move made on the evidence.
    if facts.switching_back {
        return None;
    }
    // Only ever towards the cohort's majority: a tie consolidates, it never splits (the cache a
    // provider keeps in a region follows more than this cohort's traffic).
    if w.iter().any(|(p, bp)| bp > w.get(best) && !same(p, best)) {
        return None;
    }
    // On the unbiased signal both must be scored and within the gaps of each other.
    let score = |p: &ProviderId| {
        input
            .evidence
            .iter()
            .find(|e| same(&e.provider, p))
            .and_then(|e| e.score)
    };
    let (s, b) = (score(slow)?, score(best)?);
    // It leans the same way there, by less than the gaps: the tie is broken, never overruled.
    let gap = s - b;
    let material = gap >= ctx.rum.absolute_gap.get().as_secs_f64() * 1000.0
        && gap >= ctx.rum.relative_gap.fraction() * s;
    (gap >= 0.0 && !material).then_some((
        slow,
        best,
        bp,
        RumFacts {
            warmer: true,
            ..facts
        },
    ))
}
