"""``python -m largetrain_core.shards {inspect,export-megatron,export-hdf5}`` (largetrain_core.shards.export)."""

import sys

from largetrain_core.shards.export import main

sys.exit(main())
