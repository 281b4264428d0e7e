"""The Spark executor: raw_corpus, cleaned_text, deduplicated_text, filtered_text and token_shards' partitions on
Apache Spark with the outputs
of the local executor (same documents in the same order, same rejected, filtered and duplicate
records with the same reason codes, same counts), in the same on-disk layout. One implementation of
every rule: Spark runs the core functions, it does not re-express them. Only the application's
modules import pyspark; this package's import (the submitting process) does not.

By concern, one module each:

* ``submit``      the engine of the submitting process and its settings: the job file, ``spark-submit``, the counts back
* ``job``         the Spark application of one step (``spark-submit .../job.py JOB.json``)
* ``driver``      the engine inside the application: Spark tasks, and its own implementations of the steps
* ``session``     the SparkSession: this interpreter on the executors, 127.0.0.1 for local masters
* ``class_archive``  the class-data archive of Spark's JVM classes that local masters' JVMs start from
* ``tasks``       items cut into byte-balanced runs, one task each; their counts collected
* ``commit``      the task commit protocol: attempt directories, publish by rename (or one PUT under a
                  bucket version's prefix), inputs from the bucket, the driver's check
* ``ingest``      raw_corpus: chunks of files read by the core reader
* ``map_parts``   a per-document stage (cleaned_text's rules, any PartStep) part by part
* ``dedup``       deduplicated_text: signatures, the shuffle on (band, hash), duplicates, kept documents
* ``decontamination``  filtered_text's n-gram join with the evaluation sets, the index broadcast
* ``tokenize``    a partition of token_shards: runs of part files tokenized and packed, one task each
* ``components``  connected components by alternating large-star and small-star (Kiveris et al. 2014)
* ``progress``    the step the driver is in and Spark stage progress, for the log
"""

from largetrain_core.executors.spark.submit import EXECUTOR, SparkExecutor  # noqa: F401
