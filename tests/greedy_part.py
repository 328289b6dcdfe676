"""Where a greedy continuation parts from the CPU path's, and by how much the CPU's own token led the
other there, both scored on the CPU (`run MODEL --score ... --ids --device cpu`). The GPU checks
(kernels/gpu_checks.sh: models, smollm2, quant) compare greedy GPU ids with the CPU's this way: bf16
or int8 arithmetic may turn a near-tie, so a parting is a bug only where the lead passes their bound."""
import subprocess


def cpu_lead(run, model, prompt, cpu, other, env=None):
    """prompt, cpu, other: ids (str or int). The first step i where other and cpu differ and the CPU's
    lead there, nll(other[i]) - nll(cpu[i]) in nats after prompt + cpu[:i]; None where they agree
    over their common length."""
    cpu, other = [str(t) for t in cpu], [str(t) for t in other]
    i = next((j for j, (x, y) in enumerate(zip(other, cpu)) if x != y), None)
    if i is None:
        return None
    nll = {}
    for tok in (cpu[i], other[i]):
        with open("/tmp/part.ids", "w") as f:
            f.write(" ".join([str(t) for t in prompt] + cpu[:i] + [tok]))
        out = subprocess.run([run, model, "--score", "/tmp/part.ids", "--ids", "--device", "cpu"], capture_output=True, text=True,
                             env=env).stdout
        nll[tok] = float([l for l in out.splitlines() if l[:1].isdigit()][-1].split()[2])
    return i, nll[other[i]] - nll[cpu[i]]
