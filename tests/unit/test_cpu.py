"""One reader of /proc/cpuinfo (largetrain_core.training.cpu) for the peak FLOP/s, the bf16 check, the
device name and DeepSpeed's op builders: the first processor's block, as written."""

from pathlib import Path

from largetrain_core.training.cpu import cpu_fields, cpu_flags
from largetrain_core.training.distributed import cpu_info
from largetrain_core.training.flops import cpu_peak_flops

TWO_SOCKETS = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz\n"
    "cpu MHz\t\t: 3200.000\nflags\t\t: fpu sse4_2 avx2 fma avx512f amx_bf16\n\n"
    "processor\t: 1\nvendor_id\t: OtherVendor\nmodel name\t: other\nflags\t\t: fpu\n\n"
)


def test_the_first_processors_fields_as_written():
    fields = cpu_fields(TWO_SOCKETS)
    assert fields["vendor_id"] == "GenuineIntel" and fields["cpu MHz"] == "3200.000"
    assert fields["model name"] == "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"  # the colon in the value is kept
    assert cpu_flags(TWO_SOCKETS) == {"fpu", "sse4_2", "avx2", "fma", "avx512f", "amx_bf16"}
    assert cpu_fields("") == {} and cpu_flags("") == set()


def test_its_users_read_the_same_fields():
    peak, how = cpu_peak_flops(cores=2, cpuinfo=TWO_SOCKETS)  # the nominal clock of the model name, not cpu MHz
    assert peak == 2 * 2.0e9 * 64 and "AVX-512" in how
    info = cpu_info(TWO_SOCKETS, machine="x86_64")
    assert info["vendor_id_raw"] == "GenuineIntel" and info["flags"] == sorted(cpu_flags(TWO_SOCKETS))
    assert cpu_info(TWO_SOCKETS, machine="aarch64") is None


def test_this_host():
    assert Path("/proc/cpuinfo").is_file() and cpu_flags() and cpu_fields()["model name"]
