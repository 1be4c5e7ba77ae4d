//! Which continent a country sits on, for falling back from a country cut to a continent cut.
//! Continents follow Route 53's geolocation codes.

use std::sync::OnceLock;

use crate::network::{Continent, Country};

const AFRICA: &str = "AO BF BI BJ BW CD CF CG CI CM CV DJ DZ EG EH ER ET GA GH GM GN GQ GW KE KM LR LS \
LY MA MG ML MR MU MW MZ NA NE NG RE RW SC SD SH SL SN SO SS ST SZ TD TG TN TZ UG YT ZA ZM ZW";
const ANTARCTICA: &str = "AQ BV GS HM TF";
const ASIA: &str = "AE AF AM AZ BD BH BN BT CC CN CX CY GE HK ID IL IN IO IQ IR JO JP KG KH KP KR KW \
KZ LA LB LK MM MN MO MV MY NP OM PH PK PS QA SA SG SY TH TJ TL TM TR TW UZ VN YE";
const EUROPE: &str = "AD AL AT AX BA BE BG BY CH CZ DE DK EE ES FI FO FR GB GG GI GR HR HU IE IM IS IT \
JE LI LT LU LV MC MD ME MK MT NL NO PL PT RO RS RU SE SI SJ SK SM UA VA XK";
const NORTH_AMERICA: &str = "AG AI AW BB BL BM BQ BS BZ CA CR CU CW DM DO GD GL GP GT HN HT JM KN KY LC MF \
MQ MS MX NI PA PM PR SV SX TC TT US VC VG VI";
const OCEANIA: &str =
    "AS AU CK FJ FM GU KI MH MP NC NF NR NU NZ PF PG PN PW SB TK TO TV UM VU WF WS";
const SOUTH_AMERICA: &str = "AR BO BR CL CO EC FK GF GY PE PY SR UY VE";

/// The continent of `country`, or `None` for codes this table does not know.
///
/// A table lookup (built once), cheap enough for every beacon on the ingest path.
pub fn continent_of(country: Country) -> Option<Continent> {
    index(country.as_str().as_bytes()).and_then(|i| table()[i])
}

/// Whether `code` (two uppercase ASCII letters) is an assigned ISO 3166-1 alpha-2 country code,
/// or `XK` (Kosovo, the user-assigned code geolocation databases and CDNs use).
pub(crate) fn is_assigned(code: &[u8]) -> bool {
    index(code).is_some_and(|i| table()[i].is_some())
}

fn table() -> &'static [Option<Continent>; 26 * 26] {
    static TABLE: OnceLock<[Option<Continent>; 26 * 26]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = [None; 26 * 26];
        for (list, continent) in [
            (AFRICA, Continent::Africa),
            (ANTARCTICA, Continent::Antarctica),
            (ASIA, Continent::Asia),
            (EUROPE, Continent::Europe),
            (NORTH_AMERICA, Continent::NorthAmerica),
            (OCEANIA, Continent::Oceania),
            (SOUTH_AMERICA, Continent::SouthAmerica),
        ] {
            for code in list.split_ascii_whitespace() {
                if let Some(slot) = index(code.as_bytes()) {
                    table[slot] = Some(continent);
                }
            }
        }
        table
    })
}

fn index(code: &[u8]) -> Option<usize> {
    match code {
        [a @ b'A'..=b'Z', b @ b'A'..=b'Z'] => Some((a - b'A') as usize * 26 + (b - b'A') as usize),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_the_continents_of_common_markets() {
        let of = |c: &str| continent_of(Country::new(c).unwrap());
        assert_eq!(of("DE"), Some(Continent::Europe));
        assert_eq!(of("GB"), Some(Continent::Europe));
        assert_eq!(of("US"), Some(Continent::NorthAmerica));
        assert_eq!(of("BR"), Some(Continent::SouthAmerica));
        assert_eq!(of("AU"), Some(Continent::Oceania));
        assert_eq!(of("IN"), Some(Continent::Asia));
        assert_eq!(of("ZA"), Some(Continent::Africa));
    }

    #[test]
    fn the_table_holds_exactly_the_iso_3166_codes_and_kosovo() {
        let listed: Vec<&str> = [
            AFRICA,
            ANTARCTICA,
            ASIA,
            EUROPE,
            NORTH_AMERICA,
            OCEANIA,
            SOUTH_AMERICA,
        ]
        .iter()
        .flat_map(|l| l.split_ascii_whitespace())
        .collect();
        // 249 ISO 3166-1 alpha-2 codes (ISO's own list), and XK.
        assert_eq!(listed.len(), 250);
        let assigned = (b'A'..=b'Z')
            .flat_map(|a| (b'A'..=b'Z').map(move |b| [a, b]))
            .filter(|c| is_assigned(c))
            .count();
        assert_eq!(assigned, 250);
    }
}
