//! How `hugevmm host` divides its budget among the VMs: a pure function of
//! what each VM holds, needs and how much it stalls, so that it is tested
//! without a VM.
//!
//! In tiers, each served in the order of the VMs' stall (the VM whose
//! waits on memory cost most first): every VM gets its floor; then what
//! it keeps of its current limit (no more than it needs); then what it
//! needs beyond its limit; what is still left is shared equally among the
//! VMs below their guest RAM size (water-filling), so that no budget lies
//! unused while a VM could hold more. A VM that stalls thus grows out of
//! what the others do not need, and takes from what they hold only while
//! the budget cannot keep everyone: memory moves from a VM on evidence
//! that it does not use it (its working-set estimate, or resident memory
//! well below its limit), by at most an eighth of its limit a period, so
//! that a VM still filling its memory is not cut under it. Every limit
//! is a whole number of swap units.

/// What the law knows of one VM.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    /// The least it gets: the host's `--floor`, or what its vCPUs need to
    /// make progress, whichever is more.
    pub floor_bytes: u64,
    /// The most it can use: its guest RAM.
    pub max_bytes: u64,
    /// Its limit now.
    pub limit_bytes: u64,
    /// What it asks for ([`need_bytes`]).
    pub need_bytes: u64,
    /// Its vCPUs' stall over the last period, a share of their time.
    pub stall_share: f64,
}

/// A VM's need, from its figures. Calm, it is its working-set estimate
/// with a quarter of headroom when it has one; else what it holds and an
/// eighth when that is well below its limit; else its limit. It goes down
/// by at most an eighth of the limit a period (the estimate lags, and a
/// VM still filling its memory holds less than it is about to use). While
/// the VM stalls above `stall_target`, it is at least half again its
/// limit.
pub fn need_bytes(
    limit_bytes: u64,
    resident_bytes: u64,
    estimate_bytes: Option<u64>,
    stall_share: f64,
    stall_target: f64,
) -> u64 {
    let calm = match estimate_bytes {
        Some(estimate) => estimate + estimate / 4,
        None if resident_bytes < limit_bytes - limit_bytes / 8 => {
            resident_bytes + resident_bytes / 8
        }
        None => limit_bytes,
    }
    .max(limit_bytes - limit_bytes / 8);
    if stall_share > stall_target {
        calm.max(limit_bytes + limit_bytes / 2)
    } else {
        calm
    }
}

/// The limits for `vms` under `budget_bytes`, in units of `unit_bytes`.
/// Their sum is at most the budget when the floors fit in it; the caller
/// checks that they do.
pub fn divide(budget_bytes: u64, vms: &[Demand], unit_bytes: u64) -> Vec<u64> {
    let down = |bytes: u64| bytes / unit_bytes * unit_bytes;
    let floors: Vec<u64> = vms
        .iter()
        .map(|vm| down(vm.floor_bytes.min(vm.max_bytes)))
        .collect();
    let mut limits = floors.clone();
    let mut left = budget_bytes.saturating_sub(floors.iter().sum());
    let mut by_stall: Vec<usize> = (0..vms.len()).collect();
    by_stall.sort_by(|&a, &b| vms[b].stall_share.total_cmp(&vms[a].stall_share));
    let wants = |i: usize| down(vms[i].need_bytes.clamp(floors[i], vms[i].max_bytes));
    // What each keeps of its limit, then what each needs beyond it.
    let tiers: [&dyn Fn(usize) -> u64; 2] = [&|i| wants(i).min(vms[i].limit_bytes), &wants];
    for tier in tiers {
        for &i in &by_stall {
            let give = down(tier(i).saturating_sub(limits[i]).min(left));
            limits[i] += give;
            left -= give;
        }
    }
    // Water-filling: an equal share of what is left, in whole units, to
    // every VM still below its RAM, until nothing is left to give.
    loop {
        let open: Vec<usize> = (0..vms.len())
            .filter(|&i| down(vms[i].max_bytes) > limits[i])
            .collect();
        if open.is_empty() || left < unit_bytes {
            break;
        }
        let share = down(left / open.len() as u64).max(unit_bytes);
        let mut given = 0;
        for i in open {
            let give = down(
                share
                    .min(down(vms[i].max_bytes) - limits[i])
                    .min(left - given),
            );
            limits[i] += give;
            given += give;
        }
        if given == 0 {
            break;
        }
        left -= given;
    }
    limits
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const UNIT: u64 = 2 * MIB;

    fn vm(need_mib: u64, stall_share: f64) -> Demand {
        Demand {
            floor_bytes: 64 * MIB,
            max_bytes: 1024 * MIB,
            limit_bytes: 64 * MIB,
            need_bytes: need_mib * MIB,
            stall_share,
        }
    }

    #[test]
    fn the_vm_that_stalls_most_is_served_first() {
        // 512 MiB: floors take 128, the staller's 400 of need is met first.
        let limits = divide(512 * MIB, &[vm(400, 0.01), vm(400, 0.30)], UNIT);
        assert_eq!(limits, vec![112 * MIB, 400 * MIB]);
        let limits = divide(512 * MIB, &[vm(400, 0.30), vm(400, 0.01)], UNIT);
        assert_eq!(limits, vec![400 * MIB, 112 * MIB]);
    }

    #[test]
    fn a_staller_grows_out_of_what_others_do_not_need_not_what_they_keep() {
        // 512 MiB: the calm VM holds 300 and needs all of it; the staller
        // holds 200 and asks for 300. It gets what is left, 12 MiB.
        let calm = Demand {
            limit_bytes: 300 * MIB,
            ..vm(300, 0.0)
        };
        let staller = Demand {
            limit_bytes: 200 * MIB,
            ..vm(300, 0.5)
        };
        assert_eq!(
            divide(512 * MIB, &[calm, staller], UNIT),
            vec![300 * MIB, 212 * MIB]
        );
        // The calm VM's estimate says it uses 150: the staller gets its 300,
        // and the 62 MiB left are shared.
        let calm = Demand {
            need_bytes: 150 * MIB,
            ..calm
        };
        assert_eq!(
            divide(512 * MIB, &[calm, staller], UNIT),
            vec![182 * MIB, 330 * MIB]
        );
        // When the budget cannot keep both, the staller keeps its own first.
        assert_eq!(
            divide(
                256 * MIB,
                &[
                    Demand {
                        need_bytes: 300 * MIB,
                        ..calm
                    },
                    staller
                ],
                UNIT
            ),
            vec![64 * MIB, 192 * MIB]
        );
    }

    #[test]
    fn no_vm_goes_below_its_floor() {
        let limits = divide(200 * MIB, &[vm(1000, 0.5), vm(10, 0.0), vm(10, 0.0)], UNIT);
        assert_eq!(limits, vec![72 * MIB, 64 * MIB, 64 * MIB]);
    }

    #[test]
    fn what_no_vm_needs_is_shared_up_to_each_vm_s_ram() {
        let small = Demand {
            max_bytes: 128 * MIB,
            ..vm(10, 0.0)
        };
        let limits = divide(1024 * MIB, &[small, vm(100, 0.0)], UNIT);
        // The small VM holds all of its RAM; the other takes the rest.
        assert_eq!(limits, vec![128 * MIB, 896 * MIB]);
        assert!(limits.iter().sum::<u64>() <= 1024 * MIB);
    }

    #[test]
    fn the_sum_never_passes_the_budget_and_limits_are_whole_units() {
        let mut seed = 12345u64;
        let mut next = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for _ in 0..2000 {
            let n = 1 + next(5) as usize;
            let vms: Vec<Demand> = (0..n)
                .map(|_| Demand {
                    floor_bytes: (16 + next(64)) * MIB,
                    max_bytes: (128 + next(1024)) * MIB,
                    limit_bytes: next(1024) * MIB,
                    need_bytes: next(2048) * MIB,
                    stall_share: next(100) as f64 / 100.0,
                })
                .collect();
            let floors: u64 = vms.iter().map(|v| v.floor_bytes / UNIT * UNIT).sum();
            let budget = floors + next(2048) * MIB;
            let limits = divide(budget, &vms, UNIT);
            assert!(limits.iter().sum::<u64>() <= budget, "{vms:?} {limits:?}");
            for (limit, v) in limits.iter().zip(&vms) {
                assert_eq!(limit % UNIT, 0);
                assert!(*limit >= v.floor_bytes / UNIT * UNIT);
                assert!(*limit <= v.max_bytes);
            }
            // Nothing is left unused while a VM could take a unit more.
            let room: u64 = limits
                .iter()
                .zip(&vms)
                .map(|(l, v)| v.max_bytes / UNIT * UNIT - l)
                .sum();
            if room > 0 {
                assert!(budget - limits.iter().sum::<u64>() < UNIT * n as u64);
            }
        }
    }

    #[test]
    fn need_follows_the_estimate_and_grows_with_stall() {
        let target = 0.02;
        let need = |limit: u64, resident: u64, estimate: Option<u64>, stall: f64| {
            need_bytes(
                limit * MIB,
                resident * MIB,
                estimate.map(|e| e * MIB),
                stall,
                target,
            ) / MIB
        };
        assert_eq!(need(112, 100, Some(80), 0.0), 100);
        // Stalling: at least half again the limit, however small the estimate.
        assert_eq!(need(256, 250, Some(80), 0.1), 384);
        // No estimate: what it holds, less when it leaves part unused.
        assert_eq!(need(256, 250, None, 0.0), 256);
        assert_eq!(need(1024, 800, None, 0.0), 900);
        // Down by at most an eighth of the limit a period.
        assert_eq!(need(256, 64, None, 0.0), 224);
        assert_eq!(need(512, 500, Some(80), 0.0), 448);
    }
}
