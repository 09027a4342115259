//! Functions the client registers, and those refused (a later call names
//! the refusal).

use super::*;

impl Worker {
    pub(super) fn remember_refused(&mut self, function: String, why: String) {
        // Bounded: a client that keeps registering refused functions only
        // loses the better message.
        if self.refused.len() < 1024 {
            self.refused.entry(function).or_insert(why);
        }
    }

    /// Why `op` may not run: it calls a function refused at registration, or
    /// names one in an attribute (a dataset op's `f`).
    pub(super) fn refusal(&self, op: &OpRequest) -> Option<Error> {
        if self.refused.is_empty() {
            return None;
        }
        if let Some(why) = self.refused.get(&op.name) {
            return Some(Error::PermissionDenied(format!(
                "function {:?} was refused when registered: {why}",
                op.name
            )));
        }
        op.attrs.iter().find_map(|(attr, value)| {
            let functions = match AttrValue::decode(value.as_ref()).ok()?.value? {
                attr_value::Value::Func(f) => vec![f.name],
                attr_value::Value::List(list) => list.func.into_iter().map(|f| f.name).collect(),
                _ => return None,
            };
            functions.into_iter().find_map(|name| {
                let why = self.refused.get(&name)?;
                Some(Error::PermissionDenied(format!(
                    "op {} names function {name:?} (attribute {attr}), which was refused when \
                     registered: {why}",
                    op.name
                )))
            })
        })
    }

    /// Registers a FunctionDef with its nodes' devices mapped to this context.
    pub(super) fn register_function(&mut self, def: &[u8]) -> Result<()> {
        let function = match map_function(def, &self.shared.devices, &self.shared.tenant) {
            Ok(function) => function,
            Err(FunctionRefusal::Refused { name, error }) => {
                self.remember_refused(name, error.to_string());
                return Err(error);
            }
            Err(FunctionRefusal::Malformed(error)) => return Err(error),
        };
        let max = self.shared.tenant.max_context_functions;
        if !self.functions.contains_key(&function.name) && self.functions.len() >= max {
            return Err(Error::ResourceExhausted(format!(
                "eager context {} already has {max} functions registered, the most this server allows per \
                 context (--max-context-functions)",
                self.shared.context_id
            )));
        }
        self.ctx.add_function(&function.mapped).map_err(|e| {
            Error::InvalidArgument(format!(
                "function {:?} was refused: {}",
                function.name, e.message
            ))
        })?;
        self.function_shapes
            .insert(function.name.clone(), function.shape);
        self.functions
            .insert(function.name, function.without_outputs);
        Ok(())
    }

    /// Registers a FunctionDef and the functions it calls.
    pub(super) fn register_with_library(
        &mut self,
        function_def: &Bytes,
        library: &[Bytes],
    ) -> Result<()> {
        // A function refused by the tenant's rules is answered as
        // registered: the stock client registers every function it
        // traces with the server, also those it runs itself (a
        // pipeline that calls Python), and only logs a failed
        // registration. Running it, or an op naming it, is refused
        // with the reason (see `refusal`).
        let mut refused_dependency = None;
        for def in library.iter().chain(std::iter::once(function_def)) {
            match self.register_function(def) {
                Ok(()) => {}
                Err(Error::PermissionDenied(why)) => {
                    refused_dependency.get_or_insert(why);
                }
                Err(other) => return Err(other),
            }
        }
        if let Some(why) = refused_dependency {
            if let Some(name) = FunctionDefView::decode(function_def.as_ref())
                .ok()
                .and_then(|v| v.signature.map(|s| s.name))
            {
                self.remember_refused(name, why);
            }
        }
        Ok(())
    }
}
