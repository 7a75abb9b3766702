//! App-side driver calls (the sample workload). TODO
