"""Why a tracking run kept no streamline, in words a user can act on.

A run with 0 streamlines is an ordinary result (a target nothing reaches, a seed in low FA),
not an error: the pipelines count what each filter left (seeds inside the mask, streamlines
that left the seed, long enough, kept after the length limits, reaching every target) and the
first filter that left nothing is the reason the panels and the command line give.
"""

from __future__ import annotations

from tractlens.gpu import deterministic


def empty_result_reason(counts: dict, params: deterministic.DeterministicParams, n_include: int) -> str:
    """Why deterministic tracking kept no streamline, from what each filter left (``counts``:
    ``seeds``, ``started``, ``left_seed``, ``long_enough``, ``tracked``, ``reached``), with what to try."""
    if counts["started"] == 0:
        return (
            f"none of the {counts['seeds']} seeds lies inside the tracking mask outside the stop regions: "
            "move the seed region or widen the mask"
        )
    if counts["left_seed"] == 0:
        if not hasattr(params, "fa_threshold"):  # the fODF trackers: an amplitude cut-off
            return (
                f"none left the seed (fODF amplitude below the cut-off {params.cutoff} or the first step left the "
                "mask): lower the cut-off or move the seed region"
            )
        return (
            f"none left the seed (FA below {params.fa_threshold} or the first step left the mask): "
            "lower the FA threshold or move the seed region"
        )
    if counts["long_enough"] == 0:
        return (
            f"all {counts['left_seed']} were shorter than the minimum length ({params.min_length_mm:g} mm): "
            "lower the minimum length"
        )
    if counts["tracked"] == 0:
        return (
            f"all {counts['long_enough']} reached the maximum length ({params.max_length_mm:g} mm) and truncated "
            "streamlines are discarded: raise the maximum length or keep truncated ones"
        )
    if n_include and counts["reached"] == 0:
        where = "the target region" if n_include == 1 else f"all {n_include} target and waypoint regions"
        return f"none of the {counts['tracked']} tracked reached {where}: move the seed or the target, or raise the maximum angle"
    return f"all {counts['tracked']} tracked entered an exclusion region"


def geodesic_empty_reason(provenance: dict) -> str:
    """Why geodesic tracking kept no fibre, from its provenance's counts: how the fibres ended
    (``stop_reasons``) and what to try for the most common ending."""
    endings = provenance.get("stop_reasons") or {}
    where = "; ".join(f"{n} {reason}" for reason, n in sorted(endings.items(), key=lambda kv: -kv[1]))
    ended = f" (how they ended: {where})" if where else ""
    tries = {
        "left the mask": f"raise the mask tolerance (now {provenance.get('mask_tolerance_mm', 0):g} mm), "
        "use the adaptive metric, or widen the tracking mask",
        "max steps": "raise the maximum steps or the step length",
        "left the volume": "use a tracking mask or a cone of directions around ±e1",
        "FA below threshold": "lower the FA threshold",
        "angle above maximum": "raise the maximum angle",
        "max length": "raise the maximum length",
    }
    common = max(endings, key=endings.get) if endings else None
    advice = tries.get(common, "try more directions, a wider cone, more steps or two-point ray tracing")
    if provenance.get("reached_target") == 0:
        return f"none of the {provenance['fibers']} fibres reached the target region{ended}: {advice}"
    if provenance.get("streamlines_removed_by_rois"):
        return f"all {provenance['streamlines_removed_by_rois']} fibres missed a waypoint region"
    return (
        f"none of the {provenance['fibers']} fibres could be traced{ended}: move the seed region or lower the threshold"
    )


def two_point_empty_reason(provenance: dict) -> str:
    """Why two-point ray tracing joined no seed–target pair, with what to try."""
    return (
        f"none of the {provenance['pairs']} seed–target pairs was joined within {provenance['tolerance_mm']:.2g} mm "
        f"(median miss {provenance['median_miss_mm'] or float('nan'):.3g} mm): raise the mask tolerance, "
        "the steps or the directions sampled, or try another metric"
    )
