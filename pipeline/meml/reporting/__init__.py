"""From result files to tables: reading them (results), the statistics of a paired comparison
(stats), the paper's tables and the extra ones (tables, extras), the written summary (summary),
the report (report) and the message at the end of a run (finish). The top layer of the stages."""
