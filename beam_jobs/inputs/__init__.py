"""The job's first stage: raw files matched, planned into pieces in the driver, and read as Arrow RecordBatches.

``sources`` matches the files and reads them (``ReadRecordBatches``), ``plan``
cuts them into pieces (files, row groups, byte ranges), ``piece_readers`` reads
one piece in a plain DoFn, ``text_lines`` and ``tfrecord`` frame CSV lines and
TFRecord records.
"""
