"""``kernelab tour``: the tutorial's experiment, end to end, on whatever machine this is.

The tutorial asks how many kernels ``(a + b).relu()`` is. Eager PyTorch: two (add, then relu),
and the sum ``a + b`` makes a round trip through GPU memory: five array transfers (read a, read b,
write t, read t, write out). Fused: one kernel and three transfers. Then the clock: at small sizes
the launch costs dominate, at large sizes the bytes do; the sweep finds where fusion starts to pay.
"""
from __future__ import annotations

import inspect
import torch

from .programs import add_relu

TOUR_SIZE = 1_000_000


def _tour_inputs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    device = torch.get_default_device()
    g = torch.Generator(device="cpu" if device.type == "meta" else device).manual_seed(0)
    if device.type == "meta":  # prediction: shapes only
        return torch.empty(n), torch.empty(n)
    return torch.randn(n, generator=g, device=device), torch.randn(n, generator=g, device=device)


def run_tour(args, console) -> int:
    from rich.panel import Panel

    from .cli import UserError, predict_flag, requested_modes, run_counts, run_sweep, save_plot, write_json

    measured = torch.cuda.is_available() and not args.predict
    where = torch.cuda.get_device_name() if measured else f"the {args.profile} profile (no GPU here: predicted)"
    console.print(Panel(
        f"[bold]What exactly is a kernel?[/bold]  The tutorial's function, counted on {where}:\n\n"
        + inspect.getsource(add_relu).strip(),
        title="kernelab tour", expand=False))
    comparison = run_counts(add_relu, _tour_inputs(TOUR_SIZE), args, "add_relu")
    console.print(comparison)
    eager = comparison.reports.get("eager")
    if eager is not None:
        console.print(_explain(eager))
    console.print(f"\n[bold]Sweep[/bold] n = {args.sizes}: where does fusion start to pay?")
    result = run_sweep(add_relu, _tour_inputs, args, "add_relu")
    console.print(result.table())
    console.print(f"plot: {save_plot(result, args.out)}")
    if args.json:
        write_json(args.json, {"schema_version": 1, "count": comparison.to_dict(), "sweep": result.to_rows()})
    if "eager" in requested_modes(args) and eager is None:
        raise UserError("the tour could not count eager mode")
    return 0


def _explain(eager) -> str:
    trips = eager.round_trips
    trip = trips[0] if trips else None
    text = (f"\nEager launches {eager.num_kernels} kernels and moves {eager.transfers:.3g} arrays' worth of bytes; "
            f"a fully fused kernel would move {eager.ideal_transfers:.3g}.")
    if trip is not None:
        text += (f" The extra {eager.transfers - eager.ideal_transfers:.3g} are the round trip of a {trip.dtype} "
                 f"array of {list(trip.shape)}: written by kernel {trip.writer}, read back by kernel "
                 f"{', '.join(map(str, trip.readers))}.")
    if not eager.measured:
        text += " (Predicted: no GPU ran. On a GPU the same command measures.)"
    return text
