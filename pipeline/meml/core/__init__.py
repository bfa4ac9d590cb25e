"""The foundation every stage stands on: files written atomically and errors that name their place
(io), the config (config), the records of a data set (records), the answer checker (answers), the
end-of-turn tokens (stops), precision, and MLflow tracking. Imports nothing else of meml."""
